"""What each attempt's watchers hand the supervisor's loop, filed by it (``filing``): a relay and a filer an attempt,
its malformed metric records counted, and what could not be stored, kept for the job's final reason."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from launcher.metrics.record import Rejected, RejectedCount
from launcher.run.filing import Filer, Lost, Noted, Waited
from launcher.run.liveness import Liveness
from launcher.run.watcher import Relay
from launcher.store.db import Store

FLUSH_S = 300.0  # at an attempt's end, how long what the store's lock held back may wait for it


class Intake:
    """One job's intake, attempt after attempt; only the supervisor's loop calls it (the one writer of the store)."""

    def __init__(self, store: Store, job_id: str, secrets: Mapping[str, str], echo: Callable[[str], None],
                 note: Callable[[str], None], sequence: Callable[[], int],
                 guarded: Callable[[str, Callable[[], object]], None]) -> None:
        self.store, self.job_id, self.secrets = store, job_id, secrets
        self.echo, self.note, self.sequence, self.guarded = echo, note, sequence, guarded
        self.rejected = RejectedCount()
        self.lost: dict[int, Lost] = {}
        self._relay: Relay | None = None
        self._filer: Filer | None = None

    def new_attempt(self, attempt: int, world_size: int, rejected: Callable[[int, Rejected], None],
                    live: Liveness) -> Relay:
        """The relay of ``attempt``'s watchers (what the previous attempt's handed over last is filed first)."""
        self.file_losses(live)
        self._relay = Relay(world_size=world_size, secrets=self.secrets, echo=self.echo, note=self.note,
                            sequence=self.sequence)
        self._filer = Filer(self.store, self.job_id, attempt, self._relay.losses, rejected, self.note)
        return self._relay

    def observe(self, live: Liveness) -> Waited | None:
        """Apply what the watchers handed over: observations to the attempt's Liveness, the rest filed in the store
        in one transaction (only the loop writes either), or held while another process locks it (``Waited``: once
        what it held back got in)."""
        if self._relay is not None and self._filer is not None:
            return self._filer.take(self._relay.handed, live, time.time())
        return None

    def event(self, kind: str, message: str, data: dict) -> None:
        """An event for the job's history, filed with the round's records (held, in order, while the store is locked)."""
        if self._relay is not None:
            self._relay.handed.put(Noted(kind, message, data))
        else:
            self.guarded(f"filing the event {kind!r}", lambda: self.store.add_event(self.job_id, kind, message, data))

    def file_rejected(self) -> None:
        """One event for the attempt's dropped metric records, then count afresh."""
        count, self.rejected = self.rejected, RejectedCount()
        if count.count:
            self.store.add_event(self.job_id, "metrics_rejected",
                                 f"{count.count} malformed metric record(s) dropped; first: {count.first}",
                                 {"count": count.count, "first": count.first})

    def file_losses(self, live: Liveness) -> None:
        """File what the attempt's watchers handed over last; what could not be stored: kept for the final reason,
        and one event if the store takes it."""
        self.guarded("filing what the watchers handed over", lambda: self.observe(live))
        relay, filer = self._relay, self._filer
        if filer is not None:
            self.guarded("filing what the store's lock held back", lambda: filer.flush(FLUSH_S))
        lost = relay.losses.take() if relay is not None else None
        if filer is None or lost is None:
            return
        self.lost[filer.attempt] = lost
        data = {"attempt": filer.attempt, "records": lost.records, "samples": lost.samples, "lines": lost.lines,
                "first_error": lost.first_error}
        self.guarded("filing what was lost", lambda: self.store.add_event(
            self.job_id, "records_lost", f"attempt {filer.attempt}: {lost.describe()}", data))
