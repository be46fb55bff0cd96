"""Pytest fixture for Docker on the SSH test bed: a dockerd of its own in each of bed "a"'s first two hosts
(tools/docker_hosts.py), started once for the session and stopped at its end, with the test image imported into
each. Loaded once, from tests/conftest.py, as a plugin.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from launcher.spec.container import ContainerSpec
from tests.container_fixture import REPO_ROOT
from tools import container_image as ci
from tools import docker_hosts as dh
from tools import testbed as tb

DOCKER_BED = "a"
DOCKER_HOSTS = 2

needs_docker = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("dockerd") is None or shutil.which("docker") is None,
    reason="needs root with dockerd and a docker client (scripts/setup.sh --test installs docker.io)",
)


@dataclass(frozen=True)
class DockerHosts:
    """The hosts that run a dockerd each, and what a container of the test image needs to run the suite's python."""

    hosts: tuple[tb.Host, ...]
    daemons: tuple[dh.HostDocker, ...]
    image: str
    mounts: tuple[str, ...]
    started_s: float  # what starting the daemons and importing the image cost the session

    def spec(self, **fields) -> ContainerSpec:
        """A docker ``container:`` section for the test image; ``fields`` override or extend it."""
        values = {"image": self.image, "runtime": "docker", "pull": "never", "mounts": list(self.mounts),
                  "python": sys.executable}
        return ContainerSpec(**{**values, **fields})


@pytest.fixture(scope="session")
def docker_hosts(testbeds) -> Iterator[DockerHosts]:
    """A dockerd in each of the bed's first DOCKER_HOSTS hosts, the test image in each; stopped at the session's end."""
    if os.geteuid() != 0 or shutil.which("dockerd") is None or shutil.which("docker") is None:
        pytest.skip("needs root with dockerd and a docker client (scripts/setup.sh --test installs docker.io)")
    bed = testbeds.get(DOCKER_BED)
    began = time.monotonic()
    started: list[dh.HostDocker] = []
    try:
        for host in bed.hosts[:DOCKER_HOSTS]:
            started.append(dh.start(host))
            dh.build_image(started[-1])
        yield DockerHosts(tuple(bed.hosts[:DOCKER_HOSTS]), tuple(started), ci.DEFAULT_IMAGE,
                          tuple(ci.python_mounts(sys.executable, extra=[str(REPO_ROOT)])), time.monotonic() - began)
    finally:
        for daemon in started:
            dh.stop(daemon)
        dh.release_default_socket()
