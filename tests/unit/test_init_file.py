"""`launch init`'s cluster files: the writer (comments, flagged differences, validation) and --local, --ray."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from launcher.backends import load_cluster
from launcher.backends.ssh.clusterfile import SSHDraft, local_cluster_text, ssh_cluster_text, write
from launcher.backends.ssh.spec import SSHSpec
from launcher.backends.ssh.survey import GPU, HostReport, Interpreter, choose_python, differences
from launcher.errors import LaunchError, SpecError
from tests.helpers import launch_argv, run_cli

CONDA = "/opt/conda/bin/python"
A800 = GPU("NVIDIA A800-SXM4-80GB", 81920.0)


def _host(name: str, *, gpus: tuple[GPU, ...] = (A800,) * 8, interpreters: tuple[Interpreter, ...] | None = None,
          interface: str = "ib0", hcas: tuple[str, ...] = ("mlx5_0",)) -> HostReport:
    interpreters = interpreters if interpreters is not None else (
        Interpreter("/usr/bin/python3", "3.10.12"),
        Interpreter(CONDA, "3.11.7", "2.3.1", "0.14.4", imports_torch=True),
    )
    return HostReport(host=name, address=f"10.0.0.{name[-1]}", hostname=name, gpus=gpus, interpreters=interpreters,
                      interface=interface, route_error=None, hcas=hcas, cpus=128, memory_bytes=2 * 2**40)


def _draft(reports: list[HostReport]) -> SSHDraft:
    choice = choose_python(reports)
    return SSHDraft("a800", "launch init " + " ".join(r.host for r in reports), SSHSpec(user="train"), reports, choice,
                    differences(reports, choice))


def _written(tmp_path: Path, reports: list[HostReport]) -> tuple[str, dict]:
    out = tmp_path / "cluster.yaml"
    write(ssh_cluster_text(_draft(reports)), out, overwrite=False)
    return out.read_text(), yaml.safe_load(out.read_text())


def test_hosts_that_agree_give_pinned_values_with_comments(tmp_path):
    text, spec = _written(tmp_path, [_host("gpu-1"), _host("gpu-2")])
    assert spec["nodes"] == [{"host": "gpu-1", "gpus": 8}, {"host": "gpu-2", "gpus": 8}]
    assert spec["gpu"] == {"name": "NVIDIA A800-SXM4-80GB", "memory_gb": 80.0}
    assert spec["python"] == CONDA and spec["network"] == {"interface": "ib0", "ib_hca": "auto"}
    assert spec["ssh"]["user"] == "train"
    assert f"python: {CONDA}" in text and "on every node: Python 3.11.7, torch 2.3.1, deepspeed 0.14.4" in text
    assert "HCAs found: mlx5_0" in text and "# workdir:" in text and "DIFFER" not in text
    assert all("#" in line for line in text.splitlines() if line.strip().startswith(("name:", "backend:", "python:")))


def test_differences_are_flagged_in_the_file(tmp_path):
    h100 = GPU("NVIDIA H100 80GB HBM3", 81559.0)
    newer = (Interpreter(CONDA, "3.11.7", "2.4.0", None, imports_torch=True),)
    text, spec = _written(tmp_path, [_host("gpu-1"), _host("gpu-2", gpus=(h100,) * 4, interpreters=newer, interface="eth0")])
    assert "gpu" not in spec and "# gpu: left unset: the nodes' GPUs DIFFER" in text
    assert spec["network"]["interface"] == "auto" and "gpu-1 ib0, gpu-2 eth0" in text
    assert spec["nodes"][1] == {"host": "gpu-2", "gpus": 4}
    flagged = text[text.index("# DIFFERENCES"):]
    for expected in ("GPU model differs: gpu-1 NVIDIA A800-SXM4-80GB, gpu-2 NVIDIA H100 80GB HBM3",
                     "GPU count differs: gpu-1 8, gpu-2 4", "torch differs: gpu-1 2.3.1, gpu-2 2.4.0",
                     "deepspeed differs: gpu-1 0.14.4, gpu-2 none"):
        assert expected in flagged


def test_an_interpreter_missing_on_a_host_is_flagged_and_the_first_hosts_is_used(tmp_path):
    venv = Interpreter("/home/me/.venv/bin/python", "3.11.7", "2.3.1", "0.14.4", imports_torch=True)
    other = Interpreter("/opt/conda/envs/train/bin/python", "3.11.7", "2.3.1", "0.14.4", imports_torch=True)
    text, spec = _written(tmp_path, [_host("gpu-1", interpreters=(venv,)), _host("gpu-2", interpreters=(other,))])
    assert spec["python"] == venv.path
    assert "# DIFFERS: gpu-2 lack this path; the first host's interpreter is used." in text
    assert f"Their best: gpu-2: {other.path}" in text


def test_the_interpreter_preferred_has_torch_then_deepspeed_and_is_the_same_everywhere():
    plain = Interpreter("/usr/bin/python3", "3.10.12")
    torch_only = Interpreter("/opt/conda/bin/python", "3.11.7", "2.3.1", imports_torch=True)
    both = Interpreter("/opt/conda/envs/ds/bin/python", "3.11.7", "2.3.1", "0.14.4", imports_torch=True)
    broken = Interpreter("/home/me/venv/bin/python", "3.11.7", "2.3.1", "0.14.4", imports_torch=False, import_error="libcudart")
    hosts = [_host("h1", interpreters=(plain, broken, torch_only, both)), _host("h2", interpreters=(plain, torch_only))]
    choice = choose_python(hosts)
    assert choice.path == torch_only.path and choice.same_everywhere
    assert choose_python(hosts[:1]).path == both.path
    assert choose_python([_host("h1", interpreters=(plain,)), _host("h2", interpreters=(plain,))]).path == plain.path


def test_strange_values_stay_valid_yaml_and_node_answers_are_one_line(tmp_path):
    odd = GPU('GPU "x": #1 [next] {a: b}', 1024.0)
    text, spec = _written(tmp_path, [_host("h-1", gpus=(odd,)), _host("h-2", gpus=(odd,))])
    assert spec["gpu"]["name"] == odd.name
    report = HostReport.from_facts("h-1", "10.0.0.1", {"gpus": [{"name": 'GPU "x": #1\nnext', "total_mb": 1024.0}], "cpus": 4,
                                                       "hostname": "x" * 1000, "dev": "eth0\n# injected"})
    assert report.gpus[0].name == 'GPU "x": #1 next' and report.interface == "eth0 # injected"
    assert len(report.hostname) == 200


def test_an_invalid_file_is_never_written_and_an_existing_one_not_replaced(tmp_path):
    out = tmp_path / "cluster.yaml"
    with pytest.raises(LaunchError, match="invalid cluster file; nothing was written"):
        write("name: x\nbackend: ssh\n", out, overwrite=False)
    assert list(tmp_path.iterdir()) == []
    out.write_text("mine\n")
    with pytest.raises(SpecError, match="exists; not overwritten .*--force"):
        write(local_cluster_text("launch init --local", "local", "m", 2, 2, 0, "/usr/bin/python3"), out, overwrite=False)
    assert out.read_text() == "mine\n"
    write(local_cluster_text("launch init --local", "local", "m", 2, 2, 0, "/usr/bin/python3"), out, overwrite=True)
    assert load_cluster(out).local.slots == 2


def test_init_local_writes_the_cpus_this_process_may_use(tmp_path, home):
    out = tmp_path / "local.yaml"
    done = run_cli(home, "init", "--local", "--out", str(out))
    assert done.returncode == 0, done.stderr
    spec = load_cluster(out)
    assert spec.backend == "local" and spec.local.slots == len(os.sched_getaffinity(0))
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout if shutil.which("nvidia-smi") else ""
    assert spec.local.gpus == listed.count("GPU ")
    assert "# python:" in out.read_text() and "(of " in out.read_text()
    again = run_cli(home, "init", "--local", "--out", str(out))
    assert again.returncode == 2 and "--force" in again.stderr


@pytest.mark.skipif(not shutil.which("taskset") or len(os.sched_getaffinity(0)) < 2, reason="needs taskset and 2 CPUs")
def test_init_local_follows_the_affinity_mask(tmp_path, home):
    out = tmp_path / "one.yaml"
    cpu = str(min(os.sched_getaffinity(0)))
    done = subprocess.run(["taskset", "-c", cpu, *launch_argv("init", "--local", "--out", str(out))],
                          capture_output=True, text=True, env={**os.environ, "LAUNCH_HOME": str(home)})
    assert done.returncode == 0, done.stderr
    assert load_cluster(out).local.slots == 1


def test_init_ray_checks_the_address_before_writing(tmp_path, home):
    out = tmp_path / "ray.yaml"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        done = run_cli(home, "init", "--ray", f"ray://127.0.0.1:{port}", "--out", str(out))
        assert done.returncode == 0, done.stderr
    spec = load_cluster(out)
    assert spec.backend == "ray" and spec.ray.address == f"ray://127.0.0.1:{port}"
    assert "Ray workers" in out.read_text()
    closed = run_cli(home, "init", "--ray", f"127.0.0.1:{port}", "--out", str(tmp_path / "no.yaml"))
    assert closed.returncode == 3 and "cannot reach the Ray cluster" in closed.stderr
    assert not (tmp_path / "no.yaml").exists()
    bad = run_cli(home, "init", "--ray", "head", "--out", str(tmp_path / "no.yaml"))
    assert bad.returncode == 2 and "HOST:PORT" in bad.stderr


def test_init_refuses_mixed_modes(home):
    done = run_cli(home, "init", "gpu-01", "--local")
    assert done.returncode == 2 and "not HOST and --local" in done.stderr
    done = run_cli(home, "init", "--local", "--user", "root")
    assert done.returncode == 2 and "--user: for SSH hosts only" in done.stderr


def test_the_summary_table_marks_what_differs():
    from rich.console import Console

    from launcher.cli.init import summary_table

    newer = (Interpreter(CONDA, "3.11.7", "2.4.0", "0.14.4", imports_torch=True),)
    reports = [_host("gpu-1"), _host("gpu-2", interpreters=newer)]
    choice = choose_python(reports)
    console = Console(width=200, record=True, file=open(os.devnull, "w"))
    console.print(summary_table(reports, choice, differences(reports, choice)))
    rows = {line.split()[0]: line for line in console.export_text().splitlines() if line.strip().startswith("gpu-")}
    assert "2.3.1 !" in rows["gpu-1"] and "2.4.0 !" in rows["gpu-2"]
    assert "8 x NVIDIA A800-SXM4-80GB (80 GiB)" in rows["gpu-1"] and "!" not in rows["gpu-1"].replace("2.3.1 !", "")


def test_a_user_or_port_in_a_host_gets_the_option_that_says_it_not_a_pydantic_traceback(home):
    """Issue 39 (Low): `launch init user@host` and `host:22` printed pydantic's traceback."""
    for host, said in (("root@gpu1", "give the user with --user, not in HOST: launch init gpu1 --user root"),
                       ("gpu1:2222", "give the port with --port, not in HOST: launch init gpu1 --port 2222"),
                       ("bad host", "'bad host' is not a host name or address")):
        result = run_cli(home, "init", host)
        assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert "pydantic" not in result.stderr


def test_init_writes_its_file_never_through_a_planted_symlink(tmp_path, home):
    """Issue 39, item 12: init wrote its draft at a fixed name beside the target (.NAME.launch-init), following a
    symlink a co-tenant of a shared directory planted there onto a file of the user's."""
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / ".cluster.yaml.launch-init").symlink_to(victim)
    result = run_cli(home, "init", "--local", "--out", str(shared / "cluster.yaml"))
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "mine\n"
    assert load_cluster(shared / "cluster.yaml").backend == "local"
    assert (shared / ".cluster.yaml.launch-init").is_symlink(), "the planted link is left as it was"
