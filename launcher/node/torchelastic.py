"""torchrun's structured error file (``torch.distributed.elastic.multiprocessing.errors``) on a node.

With ``TORCHELASTIC_ERROR_FILE`` set for torchrun (the plan sets it to ``node<N>.torchrun-error.json`` in the
ranks' directory of the node's run directory, their ``LAUNCH_RUN_DIR``), torchrun records there either its first
failed rank's error, copied from that rank's own
error file (written by ``@record`` around the rank's main: ``{"message": {"message": "ValueError: ...",
"extraInfo": {"py_callstack", "timestamp"}, "errorCode": <the rank's exit code>}}``), or its own exception
(a rendezvous that timed out). A rank without ``@record`` leaves no file: the reader then has torchrun's text.
The message is the rank's (untrusted): read bounded, never followed through a symlink.
Standard library only: it runs on nodes.
"""

from __future__ import annotations

import json
import os
import stat

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
MAX_BYTES = 1024 * 1024  # a deep traceback is long; past this it is not a file torchrun wrote
MESSAGE_CHARS = 2000


def error_file(run_dir: str, node: int) -> str:
    """Node ``node``'s torchrun error file in ``run_dir`` (a path, or the run directory's token in a plan)."""
    return os.path.join(run_dir, f"node{node}.torchrun-error.json")


def clear(path: str) -> None:
    """Remove an earlier attempt's file: what is read after the command's exit is this attempt's."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def read(path: str) -> dict | None:
    """What the file records: ``{"message": str, "exit_code": int | None}`` (the exit code torchrun saw for the
    failed rank; None for torchrun's own error), or None when there is no such file or it is not torchrun's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        return None
    try:
        recorded = json.loads(data)
    except (ValueError, RecursionError):
        return None
    message = recorded.get("message") if isinstance(recorded, dict) else None
    if isinstance(message, str):  # the newer format: the message alone
        return {"message": message[:MESSAGE_CHARS], "exit_code": None}
    if not isinstance(message, dict) or not isinstance(message.get("message"), str):
        return None
    code = message.get("errorCode")
    return {"message": message["message"][:MESSAGE_CHARS], "exit_code": code if type(code) is int else None}
