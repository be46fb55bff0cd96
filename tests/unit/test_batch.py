"""global = micro x accumulation x world, any two given."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.errors import PlanError
from launcher.plan.batch import resolve_batch
from launcher.spec.job import BatchSpec


@pytest.mark.parametrize(
    "given_,world,expected",
    [
        ({"micro_batch": 16}, 4, (16, 1, 64)),
        ({"micro_batch": 16, "grad_accum": 4}, 4, (16, 4, 256)),
        ({"global_batch": 1024, "micro_batch": 16}, 16, (16, 4, 1024)),
        ({"global_batch": 1024, "grad_accum": 2}, 16, (32, 2, 1024)),
        ({"global_batch": 96, "micro_batch": 4, "grad_accum": 3}, 8, (4, 3, 96)),
    ],
)
def test_the_missing_number_is_derived(given_, world, expected):
    plan = resolve_batch(BatchSpec(**given_), world)
    assert (plan.micro_batch, plan.grad_accum, plan.global_batch) == expected


def test_a_global_batch_that_does_not_divide_names_the_numbers():
    with pytest.raises(PlanError) as info:
        resolve_batch(BatchSpec(global_batch=1000, micro_batch=16), 16)
    assert "global_batch 1000" in str(info.value) and "16 x world size 16 = 256" in str(info.value)


def test_three_numbers_that_disagree_are_refused():
    with pytest.raises(PlanError, match="not global_batch 100"):
        resolve_batch(BatchSpec(global_batch=100, micro_batch=4, grad_accum=3), 8)


def test_one_number_alone_is_not_enough():
    with pytest.raises(ValueError):
        BatchSpec(global_batch=64)


@given(st.integers(1, 64), st.integers(1, 16), st.integers(1, 64))
def test_derived_numbers_always_multiply_back(micro, accum, world):
    total = micro * accum * world
    for spec in (BatchSpec(global_batch=total, micro_batch=micro), BatchSpec(global_batch=total, grad_accum=accum),
                 BatchSpec(micro_batch=micro, grad_accum=accum)):
        plan = resolve_batch(spec, world)
        assert plan.micro_batch * plan.grad_accum * world == plan.global_batch == total
