"""The ``container:`` section: what a user may write, the errors they get, and the cluster default."""

from __future__ import annotations

import pytest

from launcher.errors import SpecError
from launcher.spec.container import ContainerSpec, Mount, PullPolicy, Runtime, effective_container
from launcher.spec.load import parse_yaml, validate


def errors_of(text: str) -> str:
    """The paragraph a user sees for a container section written as YAML in container.yaml."""
    data, lines = parse_yaml(text, "container.yaml")
    with pytest.raises(SpecError) as caught:
        validate(ContainerSpec, data, "container.yaml", lines, {})
    return str(caught.value)


def test_the_issue_example_is_valid() -> None:
    spec = ContainerSpec.model_validate({
        "image": "registry.local/pytorch-2.9-dev:v1.0", "runtime": "docker", "pull": "missing",
        "mounts": ["/data:/data:ro"], "options": [],
    })
    assert spec.runtime is Runtime.DOCKER and spec.pull is PullPolicy.MISSING
    assert spec.mounts == [Mount(source="/data", target="/data", read_only=True)]


def test_mounts_are_stored_as_the_strings_users_write() -> None:
    spec = ContainerSpec(image="x:1", mounts=["/data:/data:ro", "/ckpt:/ckpt"])
    dumped = spec.model_dump(mode="json")
    assert dumped["mounts"] == ["/data:/data:ro", "/ckpt:/ckpt:rw"]
    assert ContainerSpec.model_validate(dumped) == spec


@pytest.mark.parametrize(("text", "fragments"), [
    ("image: x\nruntime: lxc\n", ["container.yaml:2", "runtime", "'docker', 'podman' or 'apptainer'", "'lxc'"]),
    ("image: x\npull: sometimes\n", ["container.yaml:2", "pull", "'missing', 'always' or 'never'"]),
    ("image: x\nmounts: [data:/data]\n", ["container.yaml:2", "mounts.0", "'data' must be an absolute path"]),
    ("image: x\nmounts: ['/data:/data:rx']\n", ["mounts.0", "must be 'ro' or 'rw', not 'rx'"]),
    ("image: x\nmounts: ['/data']\n", ["mounts.0", "SOURCE:TARGET[:ro|rw]", "got 1"]),
    ("image: x\nmounts: ['/a,b:/b']\n", ["mounts.0", "contains ','"]),
    ("image: x\nmounts: ['/a:/']\n", ["mounts.0", "target cannot be '/'"]),
    ("image: x\nmounts: ['/a:/d', '/b:/d/']\n", ["mounts", "more than one mount targets /d"]),
    ("image: x\noptions: --ulimit nofile=1024\n", ["options", "a list of arguments, one item each"]),
    ("image: x\noptions: ['']\n", ["options", "empty string"]),
    ("image: x\noptions: ['--network=bridge']\n", ["options --network=bridge", "launch sets these itself for docker"]),
    ("image: x\nruntime: podman\noptions: ['-e', 'TOKEN=abc']\n", ["options -e", "for podman"]),
    ("image: x\nruntime: apptainer\n", ["absolute path", "apptainer pull"]),
    ("image: /i.sif\nruntime: apptainer\npull: always\n", ["pull: always does not apply to apptainer"]),
    ("image: '--privileged'\n", ["image", "cannot start with '-'"]),
    ("image: x\nvolumes: []\n", ["volumes", "unknown key", "expected one of: image, runtime, pull, mounts, python, options"]),
])
def test_bad_sections_name_the_line_the_field_and_what_was_expected(text: str, fragments: list[str]) -> None:
    message = errors_of(text)
    for fragment in fragments:
        assert fragment in message, message


def test_site_options_are_allowed() -> None:
    spec = ContainerSpec(image="x", runtime="podman",
                         options=["--ulimit", "nofile=16384:16384", "--ulimit", "nproc=8192:8192"])
    assert spec.options[1] == "nofile=16384:16384"


def test_no_section_anywhere_means_no_container() -> None:
    assert effective_container(None, None) is None


def test_the_cluster_default_applies_when_the_job_has_none() -> None:
    cluster = ContainerSpec(image="site/pytorch:2.9", runtime="podman")
    assert effective_container(None, cluster) == cluster


def test_each_key_the_job_sets_wins_over_the_cluster_default() -> None:
    cluster = ContainerSpec(image="site/pytorch:2.9", runtime="podman", options=["--ulimit", "memlock=-1"])
    job = ContainerSpec(image="team/pytorch:2.10", mounts=["/data:/data:ro"])
    merged = effective_container(job, cluster)
    assert merged.image == "team/pytorch:2.10"
    assert merged.runtime is Runtime.PODMAN  # the job did not set it: the cluster's
    assert merged.options == ["--ulimit", "memlock=-1"]
    assert merged.mounts == [Mount("/data", "/data", True)]


def test_a_job_without_image_and_a_cluster_without_one_is_refused() -> None:
    with pytest.raises(SpecError, match="no image; set container.image"):
        effective_container(ContainerSpec(runtime="podman"), None)


def test_a_merge_that_does_not_fit_its_runtime_is_refused() -> None:
    cluster = ContainerSpec(image="/images/pytorch.sif", runtime="apptainer")
    with pytest.raises(SpecError, match="pull: always does not apply to apptainer"):
        effective_container(ContainerSpec(pull="always"), cluster)
