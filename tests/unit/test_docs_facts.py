"""What the README and docs say of values users see matches what launch makes."""

from __future__ import annotations

import re
from pathlib import Path

from launcher.run.orchestrate import new_job_id

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_give_the_job_ids_length() -> None:
    suffix = new_job_id("train").removeprefix("train-")
    assert re.fullmatch(r"[0-9a-f]+", suffix)
    said = {(doc.name, int(n)) for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
            for n in re.findall(r"name>-<(\d+) hex>", doc.read_text(encoding="utf-8"))}
    assert said and {n for _, n in said} == {len(suffix)}, said
