"""The runtime commands a node runs: what an operator would check in a dry-run's command line."""

from __future__ import annotations

import pytest

from launcher.node.subreaper import run_cleanup
from launcher.plan.containers import (
    ContainerName,
    env_prefix,
    image_present_argv,
    probe_argv,
    pull_argv,
    remove_argv,
    run_argv,
    stop_argv,
)
from launcher.spec.container import ContainerSpec, Runtime

NAME = ContainerName("train-1a2b3c4d", 1)
ARGV = ["python", "-m", "torch.distributed.run", "--nnodes", "2", "train.py"]
ENV = {"MASTER_ADDR": "10.0.0.1", "LAUNCH_JOB_ID": "train-1a2b3c4d", "HF_TOKEN": "hf_s3cr3t-value"}
WORKDIR = "/home/ada/proj"


def spec(runtime: str, **fields) -> ContainerSpec:
    image = "/images/pytorch.sif" if runtime == "apptainer" else "registry.local/pytorch:2.9"
    return ContainerSpec(image=image, runtime=runtime, **fields)


def pairs(argv: list[str]) -> set[tuple[str, str]]:
    return set(zip(argv, argv[1:]))


def test_docker_command_in_full() -> None:
    argv = run_argv(spec("docker", mounts=["/data:/data:ro"], options=["--ulimit", "memlock=-1"]),
                    NAME, ARGV, ENV, WORKDIR, gpus=8)
    assert argv == [
        "docker", "run", "--rm", "--name", "launch-train-1a2b3c4d-n1",
        "--label", "launch.job=train-1a2b3c4d", "--label", "launch.node=1",
        "--pull", "never", "--network", "host", "--ipc", "host", "--gpus", "all",
        "-v", "/home/ada/proj:/home/ada/proj:rw", "-v", "/data:/data:ro", "-w", "/home/ada/proj",
        "-e", "MASTER_ADDR", "-e", "LAUNCH_JOB_ID", "-e", "HF_TOKEN",
        "--ulimit", "memlock=-1", "registry.local/pytorch:2.9", *ARGV,
    ]


def test_podman_uses_the_cdi_device_for_gpus() -> None:
    argv = run_argv(spec("podman"), NAME, ARGV, ENV, WORKDIR, gpus=4)
    assert ("--device", "nvidia.com/gpu=all") in pairs(argv)
    assert "--gpus" not in argv


def test_apptainer_command_in_full() -> None:
    argv = run_argv(spec("apptainer", mounts=["/data:/data:ro"]), NAME, ARGV, ENV, WORKDIR, gpus=8)
    assert argv == [
        "apptainer", "exec", "--cleanenv", "--nv",
        "--bind", "/home/ada/proj:/home/ada/proj:rw", "--bind", "/data:/data:ro",
        "--pwd", "/home/ada/proj", "/images/pytorch.sif", *ARGV,
    ]


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_host_network_and_ipc(runtime: str) -> None:
    argv = run_argv(spec(runtime), NAME, ARGV, ENV, WORKDIR, gpus=0)
    assert {("--network", "host"), ("--ipc", "host")} <= pairs(argv)


def test_apptainer_keeps_the_host_network_and_ipc_by_not_isolating_them() -> None:
    argv = run_argv(spec("apptainer"), NAME, ARGV, ENV, WORKDIR, gpus=0)
    assert not {"--net", "--network", "--ipc", "-C", "--containall", "-c", "--contain"} & set(argv)


@pytest.mark.parametrize("runtime", ["docker", "podman", "apptainer"])
def test_no_value_of_the_environment_is_on_the_command_line(runtime: str) -> None:
    argv = run_argv(spec(runtime), NAME, ARGV, ENV, WORKDIR, gpus=0)
    for value in ("hf_s3cr3t-value", "10.0.0.1"):
        assert not any(value in arg for arg in argv)


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_environment_goes_by_name(runtime: str) -> None:
    argv = run_argv(spec(runtime), NAME, ARGV, ENV, WORKDIR, gpus=0)
    assert {("-e", "MASTER_ADDR"), ("-e", "HF_TOKEN"), ("-e", "LAUNCH_JOB_ID")} <= pairs(argv)
    assert env_prefix(Runtime(runtime)) == ""


def test_apptainer_gets_the_environment_through_prefixed_variables() -> None:
    assert env_prefix(Runtime.APPTAINER) == "APPTAINERENV_"


def test_a_bad_variable_name_is_refused() -> None:
    with pytest.raises(ValueError, match="'A=B'"):
        run_argv(spec("podman"), NAME, ARGV, ["A=B"], WORKDIR, gpus=0)


@pytest.mark.parametrize("runtime", ["docker", "podman", "apptainer"])
def test_no_gpu_flags_on_a_cpu_node(runtime: str) -> None:
    argv = run_argv(spec(runtime), NAME, ARGV, ENV, WORKDIR, gpus=0)
    assert not {"--gpus", "--device", "--nv", "nvidia.com/gpu=all"} & set(argv)


@pytest.mark.parametrize("runtime", ["docker", "podman", "apptainer"])
def test_user_options_come_right_before_the_image_and_the_command_last(runtime: str) -> None:
    s = spec(runtime, options=["--shm-size", "8g"])
    argv = run_argv(s, NAME, ARGV, ENV, WORKDIR, gpus=2)
    at = argv.index(s.image)
    assert argv[at - 2:at] == ["--shm-size", "8g"]
    assert argv[at + 1:] == ARGV


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_container_is_named_after_job_and_node_and_removed_on_exit(runtime: str) -> None:
    argv = run_argv(spec(runtime), ContainerName("gpt2-small-0000beef", 3), ARGV, ENV, WORKDIR, gpus=0)
    assert ("--name", "launch-gpt2-small-0000beef-n3") in pairs(argv)
    assert ("--label", "launch.job=gpt2-small-0000beef") in pairs(argv)
    assert "--rm" in argv


def test_run_never_pulls_preflight_does() -> None:
    argv = run_argv(spec("docker", pull="always"), NAME, ARGV, ENV, WORKDIR, gpus=0)
    assert ("--pull", "never") in pairs(argv)


def test_a_user_mount_on_the_workdir_replaces_the_default_one() -> None:
    argv = run_argv(spec("podman", mounts=[f"/scratch/proj:{WORKDIR}:rw"]), NAME, ARGV, ENV, WORKDIR, gpus=0)
    mounts = [b for a, b in zip(argv, argv[1:]) if a == "-v"]
    assert mounts == [f"/scratch/proj:{WORKDIR}:rw"]


def test_container_names_are_valid_for_docker_and_podman() -> None:
    with pytest.raises(ValueError, match="no valid container name"):
        ContainerName("-bad", 0)
    with pytest.raises(ValueError, match="no valid container name"):
        ContainerName("job/../x", 0)


def test_image_checks_and_pulls() -> None:
    assert image_present_argv(spec("podman")) == ["podman", "image", "exists", "registry.local/pytorch:2.9"]
    assert image_present_argv(spec("docker"))[:3] == ["docker", "image", "inspect"]
    assert image_present_argv(spec("apptainer")) == ["test", "-e", "/images/pytorch.sif"]
    assert pull_argv(spec("docker")) == ["docker", "pull", "registry.local/pytorch:2.9"]
    with pytest.raises(ValueError, match="does not pull"):
        pull_argv(spec("apptainer"))


def test_stopping_and_removing_a_nodes_container() -> None:
    assert stop_argv(Runtime.DOCKER, NAME, 5.5) == ["docker", "stop", "-t", "6", "launch-train-1a2b3c4d-n1"]
    assert remove_argv(Runtime.PODMAN, NAME) == ["podman", "rm", "-f", "launch-train-1a2b3c4d-n1"]
    assert stop_argv(Runtime.APPTAINER, NAME, 5) is None
    assert remove_argv(Runtime.APPTAINER, NAME) is None


def test_a_stop_that_finds_no_container_is_no_failure_when_the_removal_succeeds() -> None:
    """The node's clean-up (its sweep's ``cleanup_failed``): a container that exited with its command is gone before
    the stop (``--rm``); the stop's "no such container" is not something left behind, a removal that fails is."""
    gone = ["sh", "-c", "echo 'Error: no container with name or ID \"x\" found: no such container' >&2; exit 125"]
    assert run_cleanup([gone, ["true"]], 0) == []
    assert run_cleanup([["true"], ["sh", "-c", "echo busy >&2; exit 1"]], 0) == ["sh -c echo busy >&2; exit 1: busy"]
    failed = run_cleanup([gone, ["false"]], 0)  # the removal failed: the stop's error may say why, both are said
    assert len(failed) == 2 and failed[0].endswith("no such container")
    assert run_cleanup([["/nonexistent/podman", "rm"]], 0)[0].startswith("/nonexistent/podman rm: ")


def test_probes_do_not_need_an_image() -> None:
    assert probe_argv(Runtime.DOCKER)[:2] == ["docker", "version"]
    assert probe_argv(Runtime.APPTAINER) == ["apptainer", "--version"]


def test_an_unmerged_section_without_image_is_refused() -> None:
    with pytest.raises(ValueError, match="no image"):
        run_argv(ContainerSpec(runtime="podman"), NAME, ARGV, ENV, WORKDIR, gpus=0)
