"""The GPU loop's data made ahead (recipes/data.py: prefetched): same batches, same order, errors where they were."""

import threading

import pytest
import torch

from launcher.recipes.data import DataSpec, prefetched, step_batches


def _spec() -> DataSpec:
    return DataSpec("convnet", rank=0, world_size=1, seed=7, samples_per_step=6, micro_batch=3)


def test_made_ahead_the_batches_are_the_sources_in_its_order():
    inline = list(step_batches(_spec(), 0, 9))
    ahead = list(prefetched(step_batches(_spec(), 0, 9), depth=2))
    assert len(ahead) == 9
    for mine, theirs in zip(ahead, inline):
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[key], theirs[key]) for key in mine)


def test_a_source_error_is_raised_after_the_batches_before_it():
    def source():
        yield {"x": torch.zeros(1)}
        yield {"x": torch.ones(1)}
        raise ValueError("data_batch_3: truncated")

    got = []
    with pytest.raises(ValueError, match="data_batch_3: truncated"):
        for batch in prefetched(source()):
            got.append(batch["x"].item())
    assert got == [0.0, 1.0]


def test_closing_early_stops_the_thread_that_makes_them():
    made = []

    def endless():
        while True:
            made.append(len(made))
            yield {"x": torch.tensor(len(made))}

    batches = prefetched(endless(), depth=2)
    assert next(batches)["x"].item() == 1
    batches.close()
    for thread in threading.enumerate():
        if thread.name == "launch-data":
            thread.join(timeout=10)
            assert not thread.is_alive(), "the data thread outlived the loop that read it"
    assert len(made) <= 5  # one read, two queued, one held while the queue was full, one being made
