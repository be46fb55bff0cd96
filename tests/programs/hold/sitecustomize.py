"""A test's hold on a recipe's ranks (the tests' own, not launch's): with this folder on the job's PYTHONPATH and
TEST_HOLD_AT_STEP set, each rank of attempt 0 stops right after reporting that step, writes
``$TEST_HOLD_DIR/rank<RANK>`` and waits there until ``$TEST_HOLD_DIR/release`` exists (or the rank is ended).

A test acts on the job at a known step however fast the machine trains: without it, the step the ranks are at
when the test acts is a race between training and the test's poll (on a fast machine the ranks passed the next
checkpoint, or ended, before the test's kill landed). Python imports this module at start-up (the ``site`` hook);
in every other process it does nothing."""

import os

_AT = os.environ.get("TEST_HOLD_AT_STEP")

if _AT and os.environ.get("LAUNCH_ATTEMPT", "0") == "0":
    import time
    from pathlib import Path

    from launcher.metrics.reporter import Reporter

    _held = Path(os.environ["TEST_HOLD_DIR"])
    _report = Reporter.step

    def _step_then_hold(self, *args, **kwargs):
        result = _report(self, *args, **kwargs)
        if self.steps_done == int(_AT):
            (_held / f"rank{os.environ.get('RANK', '0')}").touch()
            while not (_held / "release").exists():
                time.sleep(0.05)
        return result

    Reporter.step = _step_then_hold
