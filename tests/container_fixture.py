"""Pytest fixture for the podman test image (tools/container_image.py). Loaded once, from
tests/conftest.py, as a plugin.

``container_image`` makes sure runc is podman's runtime (a drop-in configuration file) and that the
image exists in the machine's store (built once, about 0.3 s; reused across sessions), and returns how
to run the suite's interpreter in it: the image, the read-only mounts and the options this VM needs.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher.spec.container import ContainerSpec
from tools import container_image as ci

REPO_ROOT = Path(__file__).resolve().parent.parent

needs_podman = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("podman") is None or shutil.which("runc") is None,
    reason="needs root with podman and runc (scripts/setup.sh --test installs them)",
)


@dataclass(frozen=True)
class TestImage:
    """The test image and what a container of it needs to run ``python`` (the suite's interpreter)."""

    __test__ = False  # not a pytest test class despite the name

    name: str
    python: str
    mounts: tuple[str, ...]
    options: tuple[str, ...]

    def spec(self, **fields) -> ContainerSpec:
        """A podman ``container:`` section for this image; ``fields`` override or extend it."""
        values = {"image": self.name, "runtime": "podman", "pull": "never", "mounts": list(self.mounts),
                  "options": list(self.options)}
        return ContainerSpec(**{**values, **fields})


@pytest.fixture(scope="session")
def container_image() -> TestImage:
    """The podman test image in the machine's store, built if missing."""
    if os.geteuid() != 0 or shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.skip("needs root with podman and runc (scripts/setup.sh --test installs them)")
    ci.ensure_runtime_conf()
    ci.build_image(ci.DEFAULT_IMAGE)
    return TestImage(name=ci.DEFAULT_IMAGE, python=sys.executable,
                     mounts=tuple(ci.python_mounts(sys.executable, extra=[str(REPO_ROOT)])),
                     options=ci.SITE_OPTIONS)
