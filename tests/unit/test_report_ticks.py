"""Plot axes of `launch report` for any finite data, however narrow or wide its range (found by the property test)."""

from __future__ import annotations

import math

import pytest

from launcher.views.report import line_chart, nice_ticks


@pytest.mark.parametrize(
    ("low", "high"),
    [(0.0, 5e-324), (0.0, 1e-310), (1e6, 1e6 + 1e-9), (-1e100, 1e100), (5.0, 5.0), (0.0, 0.0), (-3.0, -3.0),
     (1e-12, 2e-12), (0.0, 1e18 * 64)],
)
def test_ticks_are_finite_ascending_and_cover_the_range(low, high):
    ticks = nice_ticks(low, high)
    assert all(math.isfinite(t) for t in ticks) and ticks == sorted(ticks) and 2 <= len(ticks) <= 12
    slack = 1e-9 * max(abs(low), abs(high))  # the floats of the tick arithmetic
    assert ticks[0] <= low + slack and ticks[-1] >= high - slack


def test_non_finite_ends_give_one_tick():
    assert nice_ticks(float("nan"), 1.0) == [0.0]


def test_a_chart_of_subnormal_values_renders():
    assert "<polyline" in line_chart("loss", [("a", [(1.0, 0.0), (2.0, 5e-324)])], "step", "loss", zero=False)
