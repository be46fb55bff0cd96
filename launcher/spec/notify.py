"""The job's ``notify:`` section: who hears when a job ends, fails, restarts or is left unattended.

Commands run on the submitting machine (the supervisor's), as argument lists without a shell;
webhooks get a small JSON by POST. A URL that carries a token names a secret instead of holding
it: ``${NAME}``, with NAME listed under ``secrets:``, is read from the submitter's environment
when the notice is sent, so the token is never in the spec, the store or a dry-run.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, get_args
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, field_validator

from launcher.spec.base import Strict
from launcher.spec.fields import Arg, FiniteFloat, NonEmptyLine

NotifyEvent = Literal["succeeded", "failed", "cancelled", "restarted", "unattended"]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = get_args(NotifyEvent)
SECRET_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
MAX_NOTIFIERS = 16


def _webhook(url: str) -> str:
    """An http(s) URL, or one that a ``${NAME}`` reference will make whole (checked again when sent)."""
    if SECRET_REFERENCE.fullmatch(url):
        return url
    parts = urlsplit(SECRET_REFERENCE.sub("secret", url))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http:// or https:// URL (a whole URL kept secret is written '${{NAME}}')")
    if not SECRET_REFERENCE.search(urlsplit(url).netloc):  # a port kept secret is checked when sent
        try:
            parts.port  # noqa: B018 - urllib checks the port when it is read
        except ValueError:
            raise ValueError(f"{url!r}: its port is not a number from 0 to 65535") from None
    return url


Webhook = Annotated[NonEmptyLine, AfterValidator(_webhook)]


class NotifySpec(Strict):
    on: list[NotifyEvent] = Field(
        default_factory=lambda: list(NOTIFY_EVENTS), min_length=1,
        description="When to notify: succeeded, failed, cancelled, restarted (an attempt failed and the job restarts), "
        "unattended (the detached supervisor died and the job runs on without one). Default: all.",
    )
    commands: list[list[Arg]] = Field(
        default_factory=list, max_length=MAX_NOTIFIERS,
        description="Programs to run on the submitting machine, each an argument list (no shell), with LAUNCH_JOB_ID, "
        "LAUNCH_JOB_NAME, LAUNCH_JOB_EVENT, LAUNCH_JOB_STATE and LAUNCH_JOB_REASON in their environment.",
    )
    webhooks: list[Webhook] = Field(
        default_factory=list, max_length=MAX_NOTIFIERS,
        description="URLs to POST a small JSON to (job, name, event, state, reason, attempt, at, host); "
        "${NAME} is replaced by the secret NAME, which must be listed under secrets:.",
    )
    timeout: FiniteFloat = Field(
        10.0, gt=0, le=300, description="Seconds each command or webhook may take; past it, it is given up and reported.",
    )

    @field_validator("commands")
    @classmethod
    def _commands(cls, v: list[list[str]]) -> list[list[str]]:
        for argv in v:
            if not argv or not argv[0]:
                raise ValueError("each command is a non-empty argument list, its first item the program")
        return v

    def secrets_named(self) -> set[str]:
        """The secrets the webhooks name with ``${NAME}``."""
        return {name for url in self.webhooks for name in SECRET_REFERENCE.findall(url)}
