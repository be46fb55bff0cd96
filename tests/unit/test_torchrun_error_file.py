"""Reading torchrun's structured error file (``launcher.node.torchelastic``) as torch itself writes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from launcher.node import torchelastic

# a rank's main under @record raises (its file), then torchrun's own handler copies it as the parent's with the
# rank's exit code (what torchrun does for its first failed rank): both written by torch's code
WRITE = """
import os, sys
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record

@record
def main():
    raise ValueError(sys.argv[2] + "x" * 3000)

os.environ["TORCHELASTIC_ERROR_FILE"] = sys.argv[1] + "/child.json"
try:
    main()
except ValueError:
    pass
os.environ["TORCHELASTIC_ERROR_FILE"] = sys.argv[1] + "/parent.json"
ErrorHandler().dump_error_file(sys.argv[1] + "/child.json", 3)
"""


def test_the_reader_takes_what_torch_wrote_and_bounds_what_a_rank_may_write(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", WRITE, str(tmp_path), "bad batch"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    child, parent = torchelastic.read(str(tmp_path / "child.json")), torchelastic.read(str(tmp_path / "parent.json"))
    assert child is not None and parent is not None
    assert child["exit_code"] is None and parent["exit_code"] == 3
    assert child["message"] == parent["message"] == ("ValueError: bad batch" + "x" * 3000)[:torchelastic.MESSAGE_CHARS]

    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({"message": {"message": "y" * torchelastic.MAX_BYTES}}), encoding="utf-8")
    (tmp_path / "link.json").symlink_to(tmp_path / "parent.json")
    os.mkfifo(tmp_path / "fifo.json")  # a rank's trap: opening it for reading must not wait for a writer
    (tmp_path / "other.json").write_text('{"message": 3}', encoding="utf-8")
    (tmp_path / "broken.json").write_text('{"message": {"mess', encoding="utf-8")
    for name in ("huge", "link", "fifo", "other", "broken", "missing"):
        assert torchelastic.read(str(tmp_path / f"{name}.json")) is None, name
    torchelastic.clear(str(tmp_path / "parent.json"))
    torchelastic.clear(str(tmp_path / "parent.json"))  # gone already: nothing to do
    assert not (tmp_path / "parent.json").exists()
