"""The facts probe's package versions (``node.facts.version``) are importlib.metadata's, read without importing it
where the distribution is a ``.dist-info``; an ``.egg-info`` found first is read by importlib.metadata."""

from __future__ import annotations

import importlib.metadata as metadata
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.node import facts


@pytest.fixture(autouse=True)
def _fresh_index():
    facts._installed.cache_clear()
    yield
    facts._installed.cache_clear()


def test_every_installed_distribution_has_importlib_metadatas_version() -> None:
    names = {dist.metadata["Name"] for dist in metadata.distributions()}
    assert len(names) > 20
    assert {name: facts.version(name) for name in names} == {name: metadata.version(name) for name in names}
    assert facts.version("no-such-distribution", "torch") == metadata.version("torch"), "the first one installed"
    assert facts.version("no-such-distribution") is None


def test_names_match_as_importlib_metadata_matches_them_and_the_first_on_the_path_wins(tmp_path: Path,
                                                                                         monkeypatch) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for folder, text in ((first / "Nvidia_NCCL.cu12-2.21.5.dist-info", "2.21.5"), (second / "nvidia_nccl_cu12-1.0.dist-info", "1.0"),
                         (second / "legacy_pkg.egg-info", "4.5")):
        folder.mkdir(parents=True)
        (folder / ("PKG-INFO" if folder.suffix == ".egg-info" else "METADATA")).write_text(
            f"Metadata-Version: 2.1\nName: x\nVersion: {text}\n\nVersion: not a header\n")
    monkeypatch.setattr(sys, "path", [str(first), str(second)])
    assert facts.version("nvidia-nccl-cu12") == "2.21.5" == metadata.version("nvidia-nccl-cu12")
    assert facts.version("Legacy.Pkg") == "4.5" == metadata.version("Legacy.Pkg"), "an .egg-info: importlib.metadata reads it"


def test_a_facts_probe_imports_neither_importlib_metadata_nor_the_interpreter_survey() -> None:
    from launcher.node.protocol import FactsRequest
    from launcher.node.ship import node_argv

    argv = node_argv(sys.executable, "facts", FactsRequest(modules=("json",)))
    argv[1:1] = ["-X", "importtime"]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "launch_node.facts" in imported
    assert not {"importlib.metadata", "launch_node.pythons", "concurrent.futures"} & imported
