"""The batch arithmetic as `launch status JOB`, `launch metrics` and a dry run show it."""

from __future__ import annotations

from launcher.views.render import batch_text


def test_the_batch_shows_the_arithmetic_or_says_the_spec_has_none() -> None:
    assert batch_text(64, 16, 2, 2) == "global 64 = micro 16 x accumulation 2 x world 2"
    assert batch_text(None, None, None, 2) == "(not given: the program batches its own data)"
