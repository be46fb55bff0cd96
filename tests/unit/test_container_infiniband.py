"""What an InfiniBand node's container gets (device, capability, memlock) and why, what preflight reports it got,
and NCCL's own word on the transport it chose (recorded INIT/NET lines: tests/fixtures/nccl/, each file says where
its lines come from in NCCL's sources)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.backends.facts import NodeFacts
from launcher.backends.nodechecks import container_request
from launcher.node import facts as node_facts
from launcher.node.nccl import Transport, read, read_dir
from launcher.plan.netenv import NodeNetwork
from launcher.run.checks import infiniband_warnings
from launcher.spec import JobSpec
from launcher.views.nccl import NCCL_EVENT, fallback_warnings, node_transports
from launcher.views.render import plan_json, plan_text

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nccl"
IB_ARGS = [("--device", "/dev/infiniband"), ("--cap-add", "IPC_LOCK"), ("--ulimit", "memlock=-1")]


def _cluster(runtime: str = "docker", ib_hca: str | None = "auto", gpus: int = 8):
    return cluster_spec(name="a800", backend="ssh", python="/usr/bin/python3", workdir="/work",
                        network={"ib_hca": ib_hca},
                        container={"image": "/images/pytorch.sif" if runtime == "apptainer" else
                                   "registry.local/pytorch:2.9", "runtime": runtime},
                        nodes=[{"host": "a800-01", "address": "10.0.0.1", "gpus": gpus},
                               {"host": "a800-02", "address": "10.0.0.2", "gpus": gpus}])


def _job(**update) -> JobSpec:
    return JobSpec.model_validate({"name": "ib", "entrypoint": ["python", "train.py"],
                                   "resources": {"nodes": 2, "nproc_per_node": 1}, **update})


def _pairs(argv) -> set[tuple[str, str]]:
    return set(zip(argv, argv[1:]))


def _probes(memlock: int = -1, hcas: tuple[str, ...] = ("mlx5_0", "mlx5_1")) -> dict[int, NodeNetwork]:
    return {0: NodeNetwork("ib0", "10.0.0.1", hcas, memlock), 1: NodeNetwork("eth0", "10.0.0.2", (), memlock)}


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_a_node_whose_probe_found_hcas_gets_the_device_ipc_lock_and_unlimited_memlock_and_the_dry_run_says_why(
        runtime: str) -> None:
    plan = plan_job(_job(), _cluster(runtime), "ib-00000001", rdzv_port=29500, probes=_probes())
    with_hcas, without = plan.nodes
    assert set(IB_ARGS) <= _pairs(with_hcas.argv)
    assert not {"/dev/infiniband", "IPC_LOCK"} & set(without.argv)  # node 1 has no HCA: nothing added
    assert with_hcas.env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    # the options come before the image (they are run's, not the program's)
    image = with_hcas.argv.index("registry.local/pytorch:2.9")
    assert with_hcas.argv.index("/dev/infiniband") < image and with_hcas.argv.index("IPC_LOCK") < image
    text = plan_text(plan)
    assert "adds  --device /dev/infiniband  # InfiniBand HCAs mlx5_0,mlx5_1: NCCL's verbs open" in text
    assert "adds  --cap-add IPC_LOCK  # InfiniBand HCAs mlx5_0,mlx5_1: NCCL locks the memory" in text
    assert "adds  --ulimit memlock=-1  # InfiniBand HCAs mlx5_0,mlx5_1: NCCL registers (pins)" in text
    assert "adds  --ipc host  # the host's /dev/shm" in text  # shm: the host's, not the container's 64 MB
    gpu = "--gpus all" if runtime == "docker" else "--device nvidia.com/gpu=all"
    assert f"adds  {gpu}  # the node's 8 GPU(s)" in text
    assert plan_json(plan)["nodes"][0]["run_options"][-1]["args"] == ["--ulimit", "memlock=-1"]


def test_a_node_that_cannot_raise_memlock_gets_its_hard_limit_and_the_dry_run_says_so() -> None:
    plan = plan_job(_job(), _cluster(), "ib-00000001", rdzv_port=29500, probes=_probes(memlock=8 * 2**20))
    assert ("--ulimit", "memlock=8388608:8388608") in _pairs(plan.nodes[0].argv)
    assert "memlock=-1" not in plan.nodes[0].argv
    assert "the node's hard memlock limit (8192 KiB) cannot be raised here" in plan_text(plan)


def test_before_the_probe_the_dry_run_shows_the_ib_options_as_pending_and_runs_none() -> None:
    plan = plan_job(_job(), _cluster(), "ib-00000001", rdzv_port=29500)
    assert "/dev/infiniband" not in plan.nodes[0].argv
    assert ("adds  --device /dev/infiniband (probed at launch)  # if the node's probe finds InfiniBand HCAs"
            in plan_text(plan))
    # preflight checks the image with them: the node runs that probe when it has HCAs, memlock lowered by the node
    request = container_request(plan, plan.container, 0)
    assert request.ib_options is not None and set(IB_ARGS) <= _pairs(list(request.ib_options))
    assert "/dev/infiniband" not in request.inside


def test_a_pinned_hca_gets_the_options_without_a_probe_and_null_gets_none() -> None:
    pinned = plan_job(_job(), _cluster(ib_hca="mlx5_2"), "ib-00000001", rdzv_port=29500)
    assert set(IB_ARGS) <= _pairs(pinned.nodes[1].argv)
    none = plan_job(_job(), _cluster(ib_hca=None), "ib-00000001", rdzv_port=29500, probes=_probes())
    assert "/dev/infiniband" not in none.nodes[0].argv and "/dev/infiniband" not in plan_text(none)
    assert container_request(none, none.container, 0).ib_options is None


def test_apptainer_adds_nv_only_it_shares_dev_and_the_hosts_limits() -> None:
    plan = plan_job(_job(), _cluster("apptainer"), "ib-00000001", rdzv_port=29500, probes=_probes())
    argv = plan.nodes[0].argv
    assert "--nv" in argv and not {"--device", "--cap-add", "--ulimit"} & set(argv)


def test_gpu_nodes_send_nccls_init_lines_to_the_run_directory_unless_the_user_set_nccl_debug() -> None:
    plan = plan_job(_job(), _cluster(), "ib-00000001", rdzv_port=29500, probes=_probes())
    env = plan.nodes[0].env
    assert (env["NCCL_DEBUG"], env["NCCL_DEBUG_SUBSYS"]) == ("INFO", "INIT,NET")
    assert env["NCCL_DEBUG_FILE"] == "${LAUNCH_RUN_DIR}/nccl.%h.%p.log"  # not the user's log
    mine = plan_job(_job(env={"NCCL_DEBUG": "WARN"}), _cluster(), "ib-00000001", rdzv_port=29500, probes=_probes())
    assert mine.nodes[0].env["NCCL_DEBUG"] == "WARN" and "NCCL_DEBUG_FILE" not in mine.nodes[0].env
    cpu = plan_job(_job(), _cluster(gpus=0), "ib-00000001", rdzv_port=29500, probes=_probes())
    assert "NCCL_DEBUG" not in cpu.nodes[0].env


def test_the_node_lowers_the_probes_memlock_to_what_it_allows() -> None:
    argv = ["docker", "run", "--ulimit", "memlock=-1", "img"]
    assert node_facts._lowered(argv, -1) == argv
    assert node_facts._lowered(argv, 65536) == ["docker", "run", "--ulimit", "memlock=65536:65536", "img"]
    soft, most = node_facts.memlock()
    assert soft == -1 or soft >= 0 and (most == -1 or most >= soft)


def test_preflight_says_what_the_container_got() -> None:
    base = {"hcas": ["mlx5_0"], "container": {"ib_checked": True, "memlock": 8 * 2**20, "ib_devices": []}}
    warnings = infiniband_warnings("a800-01", NodeFacts.parse(base))
    assert warnings == [
        "a800-01: InfiniBand HCAs mlx5_0 on the node, but no /dev/infiniband in the container: NCCL will use TCP sockets",
        "a800-01: the container got memlock 8192 KiB, not unlimited (the node's hard limit): NCCL may fail to "
        "register large buffers with the HCA",
    ]
    good = {"hcas": ["mlx5_0"], "container": {"ib_checked": True, "memlock": -1, "ib_devices": ["uverbs0"]}}
    assert infiniband_warnings("a800-01", NodeFacts.parse(good)) == []


def _fixture(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def test_the_reader_finds_ib_with_its_hcas_gdr_version_and_channels() -> None:
    assert read(_fixture("ib_gdr.log")) == Transport(
        "IB", ("mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"), gdr=True, version="2.21.5+cuda12.4", channels=4)


def test_the_reader_tells_roce_from_ib_by_the_link_layer() -> None:
    assert read(_fixture("roce.log")) == Transport("RoCE", ("mlx5_bond_0:1",), gdr=False, version=None, channels=2)


def test_the_reader_finds_the_socket_fallback_and_its_interfaces() -> None:
    found = read(_fixture("socket_fallback.log"))
    assert found == Transport("Socket", ("ib0", "eth0"), gdr=False, version="2.18.3+cuda12.2", channels=2)
    assert found.describe() == "Socket ib0,eth0, NCCL 2.18.3+cuda12.2, 2 channels"


def test_the_reader_says_nothing_before_a_communicator_and_keeps_hostile_lines_bounded() -> None:
    assert read(_fixture("ib_gdr.log")[:5]) is None  # bootstrap only: no transport chosen yet
    hostile = ["h:1:1 [0] NCCL INFO Using network \x1b]8;;evil\x07IB", "h:1:1 [0] NCCL INFO NET/Socket : Using " + "x" * 10**6]
    found = read(hostile)
    assert found is None or all("\x1b" not in d and len(d) <= 80 for d in found.devices)


def test_the_agent_reads_only_its_own_hosts_files(tmp_path: Path) -> None:
    (tmp_path / "nccl.a800-01.2712.log").write_text((FIXTURES / "ib_gdr.log").read_text())
    (tmp_path / "nccl.a800-02.88.log").write_text((FIXTURES / "socket_fallback.log").read_text())
    assert read_dir(str(tmp_path), "a800-01").kind == "IB"
    assert read_dir(str(tmp_path), "a800-02").kind == "Socket"
    assert read_dir(str(tmp_path), "a800-03") is None


def test_a_node_planned_for_ib_whose_nccl_chose_sockets_is_a_warning() -> None:
    plan = plan_job(_job(), _cluster(), "ib-00000001", rdzv_port=29500,
                    probes={0: NodeNetwork("ib0", "10.0.0.1", ("mlx5_0",)), 1: NodeNetwork("ib0", "10.0.0.2", ("mlx5_0",))})
    stored = plan.model_dump(mode="json")
    events = [{"kind": NCCL_EVENT, "data": {"node": i, "host": h, **read(_fixture(f)).as_json()}}
              for i, h, f in ((0, "a800-01", "ib_gdr.log"), (1, "a800-02", "socket_fallback.log"))]
    shown = node_transports(stored, events)
    assert [(t.node, t.transport.kind, t.fell_back) for t in shown] == [(0, "IB", False), (1, "Socket", True)]
    [warning] = fallback_warnings(stored, events)
    assert warning.startswith("node 1 (a800-02) was planned for InfiniBand (NCCL_IB_HCA=mlx5_0) but NCCL chose "
                              "TCP sockets on ib0,eth0")
    # a node never planned for IB (ib_hca: null) that uses sockets is what was asked: no warning
    plain = plan_job(_job(), _cluster(ib_hca=None), "ib-00000001", rdzv_port=29500, probes=_probes())
    assert fallback_warnings(plain.model_dump(mode="json"), events) == []
    # a forged event (rank output is untrusted) is left out
    assert node_transports(stored, [{"kind": NCCL_EVENT, "data": {"node": 0, "host": "x", "kind": "IB\n"}}]) == []


class _Frames:
    """What the sampler writes: (kind, data) of each frame."""

    def __init__(self) -> None:
        self.frames: list[tuple[object, dict]] = []

    def event(self, kind, data: dict) -> None:
        self.frames.append((kind, data))


def test_the_agents_sampler_sends_the_transport_once_and_again_when_it_changes(tmp_path: Path) -> None:
    import socket

    from launcher.node.protocol import FrameKind
    from launcher.node.sampler import Sampler

    out = _Frames()
    sampler = Sampler("ib-00000001", 0, out, gpus=8, run_dir=str(tmp_path))  # type: ignore[arg-type]
    sampler.report_transport(str(tmp_path))
    assert out.frames == []  # no communicator yet: nothing said
    log = tmp_path / f"nccl.{socket.gethostname()}.2712.log"
    log.write_text((FIXTURES / "socket_fallback.log").read_text())
    sampler.report_transport(str(tmp_path))
    sampler.report_transport(str(tmp_path))
    assert [(kind, data["kind"]) for kind, data in out.frames] == [(FrameKind.NCCL, "Socket")]
    assert Transport.from_json(out.frames[0][1]) == read(_fixture("socket_fallback.log"))


def test_launch_status_shows_each_nodes_transport_and_the_fallback_warning() -> None:
    from rich.console import Console

    from launcher.metrics.summary import JobSummary
    from launcher.store.rows import JobRow
    from launcher.views.jobstatus import JobStatus, job_detail, job_object

    plan = plan_job(_job(), _cluster(), "ib-00000001", rdzv_port=29500,
                    probes={0: NodeNetwork("ib0", "10.0.0.1", ("mlx5_0",)), 1: NodeNetwork("ib0", "10.0.0.2", ("mlx5_0",))})
    events = tuple({"t": 0.0, "kind": NCCL_EVENT, "message": "", "data": {"node": i, "host": h, **read(_fixture(f)).as_json()}}
                   for i, h, f in ((0, "a800-01", "ib_gdr.log"), (1, "a800-02", "socket_fallback.log")))
    status = JobStatus(JobRow("ib-00000001", "ib", None, plan=plan.model_dump(mode="json")), JobSummary(), nodes=(),
                       events=events)
    shown = job_object(status)["nccl"]
    assert [(t["node"], t["kind"], bool(t["warning"])) for t in shown] == [(0, "IB", False), (1, "Socket", True)]
    console = Console(width=300, record=True)
    for part in job_detail(status):
        console.print(part)
    text = console.export_text()
    assert "nccl: node 0 a800-01: IB mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1 GDR, NCCL 2.21.5+cuda12.4, 4 channels" in text
    assert "warning: node 1 (a800-02) was planned for InfiniBand (NCCL_IB_HCA=mlx5_0) but NCCL chose TCP sockets" in text
