"""Notifiers (job spec ``notify:``): real commands and a real HTTP server on loopback."""

from __future__ import annotations

import json
import sys

import pytest
from pydantic import ValidationError

from launcher.run.notify import Notice, Notifier
from launcher.spec.job import JobSpec
from launcher.spec.notify import NotifySpec

TOKEN = "T0KEN-abcdef-123456"


def _notice(event="failed", reason=f"rank 1 printed {TOKEN}") -> Notice:
    return Notice(job="bert-1a2b3c4d", name="bert", event=event, state="FAILED", reason=reason, attempt=0)


def test_a_command_gets_the_job_in_its_environment_with_secrets_masked(tmp_path):
    out = tmp_path / "env.json"
    program = f"import json, os; open({str(out)!r}, 'w').write(json.dumps({{k: v for k, v in os.environ.items() if k.startswith('LAUNCH_JOB')}}))"
    notifier = Notifier(NotifySpec(commands=[[sys.executable, "-c", program]]), {"HOOK": TOKEN})
    assert notifier.send(_notice()) == []
    assert json.loads(out.read_text()) == {
        "LAUNCH_JOB_ID": "bert-1a2b3c4d", "LAUNCH_JOB_NAME": "bert", "LAUNCH_JOB_EVENT": "failed",
        "LAUNCH_JOB_STATE": "FAILED", "LAUNCH_JOB_REASON": "rank 1 printed ****",
    }


def test_a_webhook_gets_the_json_and_its_secret_url(hook):
    spec = NotifySpec(webhooks=[hook.url + "/hooks/${HOOK}"])
    assert Notifier(spec, {"HOOK": TOKEN}).send(_notice()) == []
    [(path, body)] = hook.posts
    assert path == f"/hooks/{TOKEN}"
    assert body["job"] == "bert-1a2b3c4d" and body["event"] == "failed" and body["state"] == "FAILED"
    assert body["reason"] == "rank 1 printed ****" and body["attempt"] == 0 and body["at"] and body["host"]


def test_events_not_asked_for_send_nothing(hook):
    notifier = Notifier(NotifySpec(on=["failed"], webhooks=[hook.url]), {})
    assert notifier.send(_notice(event="succeeded")) == []
    assert hook.posts == []
    assert Notifier(None, {}).send(_notice()) == []


def test_failing_notifiers_come_back_as_problems_without_their_tokens(hook, tmp_path):
    hook.status = 500
    spec = NotifySpec(
        commands=[[sys.executable, "-c", "import sys; print('no route to pager', file=sys.stderr); sys.exit(3)"],
                  [str(tmp_path / "missing-program")]],
        webhooks=[hook.url + "/hooks/${HOOK}", "http://127.0.0.1:9/closed"],
    )
    problems = Notifier(spec, {"HOOK": TOKEN}).send(_notice())
    assert problems[0] == f"notify command {sys.executable} exited with 3: no route to pager"
    assert problems[1].startswith(f"notify command {tmp_path / 'missing-program'} could not start: ")
    assert problems[2] == f"notify webhook {hook.url} answered 500 Internal Server Error"
    assert problems[3].startswith("notify webhook http://127.0.0.1:9 could not be reached: ")
    assert not any(TOKEN in problem for problem in problems)


def test_a_command_past_its_timeout_is_killed_and_reported(tmp_path):
    started = tmp_path / "started"
    program = f"import time; open({str(started)!r}, 'w').close(); time.sleep(600)"
    spec = NotifySpec(commands=[[sys.executable, "-c", program]], timeout=0.5)
    assert Notifier(spec, {}).send(_notice()) == [f"notify command {sys.executable} took longer than 0.5 s and was killed"]
    assert started.exists()


# A helper that outlives its command (a daemon: its own session, stderr still open) until the test ends it.
DAEMONIZES = """import os, sys, time
if os.fork() == 0:
    os.setsid()
    open(sys.argv[1], "w").write(str(os.getpid()))
    time.sleep(600)
    os._exit(0)
time.sleep(int(sys.argv[2]))
"""


def test_a_command_that_leaves_a_daemon_holding_stderr_never_holds_the_supervisor_past_the_timeout(tmp_path, hook):
    """Issue 39, item 11: such a command held the supervisor 95 s for a timeout of 3 s (for ever when the helper
    kept stderr); a webhook with a port out of range then silenced every later notifier."""
    import os
    import signal
    import time

    daemons = [tmp_path / "quick.pid", tmp_path / "slow.pid"]
    spec = NotifySpec.model_construct(on=["failed"], timeout=1.0, commands=[
        [sys.executable, "-c", DAEMONIZES, str(daemons[0]), "0"],
        [sys.executable, "-c", DAEMONIZES, str(daemons[1]), "600"]], webhooks=["http://127.0.0.1:99999/x", hook.url])
    started = time.monotonic()
    try:
        problems = Notifier(spec, {}).send(_notice())
        took = time.monotonic() - started
    finally:
        for path in daemons:
            if path.exists():
                os.kill(int(path.read_text()), signal.SIGKILL)
    assert took < 5, f"send took {took:.1f} s for two commands of a 1 s timeout"
    assert problems[0] == f"notify command {sys.executable} took longer than 1 s and was killed"
    assert problems[1].startswith("notify webhook http://127.0.0.1:99999/x: Port out of range")
    assert len(problems) == 2 and len(hook.posts) == 1, "the webhook after the bad one was still told"


@pytest.mark.parametrize("notify, secrets, message", [
    ({"webhooks": ["ftp://example.org/x"]}, [], "is not an http:// or https:// URL"),
    ({"webhooks": ["http://example.org:99999/x"]}, [], "its port is not a number from 0 to 65535"),
    ({"webhooks": ["https://hooks.example/${HOOK}"]}, [], "webhooks name ${HOOK}, which secrets: does not list"),
    ({"commands": [[]]}, [], "each command is a non-empty argument list"),
    ({"on": ["exploded"]}, [], "Input should be 'succeeded', 'failed', 'cancelled', 'restarted' or 'unattended'"),
])
def test_bad_notify_sections_are_refused(notify, secrets, message):
    with pytest.raises(ValidationError) as error:
        JobSpec(name="j", entrypoint=["train.py"], secrets=secrets, notify=notify)
    assert message in str(error.value)


def test_a_webhook_naming_a_listed_secret_is_accepted():
    spec = JobSpec(name="j", entrypoint=["train.py"], secrets=["HOOK"], notify={"webhooks": ["${HOOK}"]})
    assert spec.notify is not None and spec.notify.secrets_named() == {"HOOK"}
