"""How a supervised job ends: its outcome, written once as the job's terminal state, whatever fails on the way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from launcher.backends.failures import Failure
from launcher.metrics.aggregate import summarize
from launcher.run.filing import Lost
from launcher.store.db import Store
from launcher.store.states import JobState


@dataclass(frozen=True)
class Outcome:
    """How an attempt, then the job, ended: the state, why, and the first failure."""

    state: JobState
    reason: str | None = None
    failure: Failure | None = None

    def with_reason(self, reason: str | None) -> Outcome:
        return replace(self, reason=reason)

    def with_losses(self, lost: dict[int, Lost]) -> Outcome:
        """The outcome that says what the store did not get (by attempt): a job that kept everything is the only clean one."""
        if not lost:
            return self
        said = "; ".join(f"attempt {attempt}: {item.describe()}" if len(lost) > 1 else item.describe()
                         for attempt, item in sorted(lost.items()))
        if self.state == JobState.SUCCEEDED:
            return self.with_reason(f"succeeded, but its record is incomplete: {said}")
        return self.with_reason(f"{self.reason or self.state}; also {said}")


def finish(store: Store, job_id: str, outcome: Outcome, note: Callable[[str], None]) -> JobState:
    """Record ``outcome`` as the job's terminal state (summary, transition, event); the state the job is in after.

    Each step is guarded: a summary that cannot be made is left out, a transition that cannot be written
    with everything is tried with the state and reason alone, and an event that cannot be filed is noted.
    A job that had already ended (cancelled by `launch cancel` once its supervisor was gone) keeps its state.
    """
    try:
        summary = summarize(store.metrics(job_id), store.samples(job_id))
    except Exception as exc:  # noqa: BLE001 - a summary that cannot be made must not keep the job open
        note(f"the metric summary could not be made: {exc!r}")
        summary = None
    failure = outcome.failure.model_dump(mode="json") if outcome.failure else None
    try:
        written = store.transition(job_id, outcome.state, reason=outcome.reason, first_failure=failure, summary=summary,
                                   failure_kind=outcome.failure.kind if outcome.failure else None)
    except Exception as exc:  # noqa: BLE001 - then the state and its reason alone
        note(f"the final state could not be written with its details: {exc!r}")
        try:
            written = store.transition(job_id, outcome.state, reason=outcome.reason,
                                       failure_kind=outcome.failure.kind if outcome.failure else None)
        except Exception as again:  # noqa: BLE001 - nothing more can be done here; the note says it
            note(f"the final state {outcome.state} ({outcome.reason}) could not be written: {again!r}")
            return outcome.state
    if not written:
        try:
            return store.state(job_id)
        except Exception as exc:  # noqa: BLE001 - the store cannot be read: what this supervisor decided
            note(f"the job's state could not be read back: {exc!r}")
            return outcome.state
    try:
        store.add_event(job_id, outcome.state.lower(), outcome.reason or outcome.state)
    except Exception as exc:  # noqa: BLE001 - the state is written; the event is detail
        note(f"the final event could not be filed: {exc!r}")
    return outcome.state
