"""Telling people a job ended, failed, restarted or was left unattended (the job spec's ``notify:``).

A notice tells the state that is true (``RESTARTING`` for a restart, with its re-plan), and for the end
the steps done, how long the job ran and its samples/s; a cancel says who asked for it (the
``cancel_requested`` event's user and host).

Each notifier gets ``timeout`` seconds. A notifier that fails (an exit code, an HTTP error, no
answer in time) comes back as a problem the caller files as the job's event: a notice never
fails or holds up a job for longer than its timeouts. What is sent is masked with the job's
secrets, and a webhook's URL is shown without its path (where tokens live) in any problem.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from urllib.parse import urlsplit

from launcher.plan.shell import mask
from launcher.spec.notify import SECRET_REFERENCE, NotifyEvent, NotifySpec
from launcher.store.db import Store
from launcher.store.rows import JobRow

OUTPUT_SHOWN = 200
RESTARTING = "RESTARTING"  # the state a restart notice tells: the job goes on (never FAILED, which it is not)
REPLAN_EVENTS = ("elastic_restart", "node_left_out")  # what the next attempt changed, filed before its restart


@dataclass(frozen=True)
class Notice:
    """What happened to a job, as its notifiers receive it."""

    job: str
    name: str
    event: NotifyEvent
    state: str
    reason: str
    attempt: int
    #: a restart: what the next attempt changed (an elastic job's re-plan, a node left out); None: nothing
    replan: str | None = None
    #: the end: optimizer steps done, seconds from start to end, samples/s (None: not measured)
    steps: int | None = None
    duration_s: float | None = None
    samples_per_sec: float | None = None
    #: a cancel: who asked for it (``user@host``, from `launch cancel`'s event or the supervisor's own Ctrl-C)
    cancelled_by: str | None = None

    def as_env(self) -> dict[str, str]:
        told = {"LAUNCH_JOB_ID": self.job, "LAUNCH_JOB_NAME": self.name, "LAUNCH_JOB_EVENT": self.event,
                "LAUNCH_JOB_STATE": self.state, "LAUNCH_JOB_REASON": self.reason}
        more = {"LAUNCH_JOB_REPLAN": self.replan, "LAUNCH_JOB_STEPS": self.steps, "LAUNCH_JOB_DURATION_S": self.duration_s,
                "LAUNCH_JOB_SAMPLES_PER_SEC": self.samples_per_sec, "LAUNCH_JOB_CANCELLED_BY": self.cancelled_by}
        return {**told, **{name: str(value) for name, value in more.items() if value is not None}}


def told(store: Store, row: JobRow, notice: Notice) -> Notice:
    """The notice with what the store knows of its event: a restart's true state and re-plan, the end's figures, who
    cancelled."""
    events = store.events(row.id)
    if notice.event == "restarted":
        return replace(notice, state=RESTARTING, replan=_replan(events))
    if notice.event not in ("succeeded", "failed", "cancelled"):
        return notice
    from launcher.views.jobstatus import job_summary

    summary = job_summary(store, row)
    ran = row.ended_at - row.started_at if row.ended_at is not None and row.started_at is not None else None
    notice = replace(notice, steps=summary.steps if summary.steps else None, samples_per_sec=summary.samples_per_sec,
                     duration_s=round(ran, 1) if ran is not None else None)
    if notice.event == "cancelled":
        who = _cancelled_by(events)
        notice = replace(notice, cancelled_by=who, reason=f"cancelled by {who} (launch cancel)" if who else notice.reason)
    return notice


def _replan(events: list[dict]) -> str | None:
    """What the attempt about to start changed: the re-plan events filed since the restart before it."""
    kinds = [e.get("kind") for e in events]
    last = len(kinds) - 1 - kinds[::-1].index("restarting") if "restarting" in kinds else len(kinds)
    before = max((i for i, kind in enumerate(kinds[:last]) if kind == "restarting"), default=-1)
    found = [e["message"] for e in events[before + 1:last + 1] if e.get("kind") in REPLAN_EVENTS]
    return "; ".join(found) or None


def _cancelled_by(events: list[dict]) -> str | None:
    """``user@host`` of the newest `launch cancel` of the job, as its ``cancel_requested`` event recorded it."""
    for event in reversed(events):
        data = event.get("data")
        if event.get("kind") == "cancel_requested" and isinstance(data, dict):
            user, host = data.get("user"), data.get("host")
            if isinstance(user, str) and isinstance(host, str):
                return f"{user}@{host}"
    return None


class Notifier:
    """Sends a job's notices as its ``notify:`` section says; ``send`` returns the problems, never raises."""

    def __init__(self, spec: NotifySpec | None, secrets: Mapping[str, str]) -> None:
        self.spec = spec
        self.secrets = dict(secrets)

    def wants(self, event: NotifyEvent) -> bool:
        return self.spec is not None and event in self.spec.on

    def tell(self, store: Store, job_id: str, name: str, event: NotifyEvent, state: str, reason: str | None) -> None:
        """Send the job's notice of ``event`` (its reason, else the job's; its attempt from the store); each
        notifier's problem becomes the job's ``notify_failed`` event."""
        if not self.wants(event):
            return
        row = store.job(job_id)
        notice = told(store, row, Notice(job=job_id, name=name, event=event, state=state,
                                         reason=reason or row.reason or state, attempt=row.attempt or 0))
        for problem in self.send(notice):
            store.add_event(job_id, "notify_failed", problem)

    def send(self, notice: Notice) -> list[str]:
        if self.spec is None or not self.wants(notice.event):
            return []
        notice = replace(notice, job=mask(notice.job, self.secrets), name=mask(notice.name, self.secrets),
                         reason=mask(notice.reason, self.secrets),
                         replan=None if notice.replan is None else mask(notice.replan, self.secrets))
        problems = [self._run(argv, notice) for argv in self.spec.commands]
        problems += [self._post(url, notice) for url in self.spec.webhooks]
        return [mask(problem, self.secrets) for problem in problems if problem]

    def _run(self, argv: list[str], notice: Notice) -> str | None:
        """Run one command for at most ``timeout`` seconds. Its stderr goes to a file, not a pipe: a helper it
        leaves behind (a daemon) holding stderr open cannot hold the supervisor; past the timeout its process
        group is killed and nothing more is awaited but the command itself."""
        what = f"notify command {argv[0]}"
        assert self.spec is not None
        with tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(argv, env={**os.environ, **notice.as_env()}, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
            except OSError as exc:
                return f"{what} could not start: {exc.strerror or exc}"
            try:
                proc.wait(timeout=self.spec.timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # our own child's session: nothing else is in it
                except ProcessLookupError:
                    pass
                proc.wait()
                return f"{what} took longer than {self.spec.timeout:g} s and was killed"
            if proc.returncode != 0:
                err.seek(max(0, os.fstat(err.fileno()).st_size - 4 * OUTPUT_SHOWN))
                said = err.read().decode(errors="replace").strip().splitlines()
                tail = f": {said[-1][:OUTPUT_SHOWN]}" if said else ""
                return f"{what} exited with {proc.returncode}{tail}"
        return None

    def _post(self, url: str, notice: Notice) -> str | None:
        assert self.spec is not None
        whole = SECRET_REFERENCE.sub(lambda match: self.secrets.get(match[1], ""), url)
        parts = urlsplit(whole)
        try:
            port = parts.port
        except ValueError as exc:  # a port out of range: this webhook's problem, never the next notifier's
            return f"notify webhook {url}: {exc}"
        shown = f"{parts.scheme}://{parts.hostname or '?'}" + (f":{port}" if port else "")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return f"notify webhook {url}: not an http:// or https:// URL once its secrets are put in"
        body = json.dumps({**asdict(notice), "at": datetime.now(UTC).isoformat(timespec="seconds"),
                           "host": socket.gethostname()}).encode()
        request = urllib.request.Request(whole, data=body, method="POST",
                                         headers={"Content-Type": "application/json", "User-Agent": "launch"})
        try:
            with urllib.request.urlopen(request, timeout=self.spec.timeout) as answer:
                answer.read(OUTPUT_SHOWN)
        except urllib.error.HTTPError as exc:
            return f"notify webhook {shown} answered {exc.code} {exc.reason}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            return f"notify webhook {shown} could not be reached: {reason}"
        return None
