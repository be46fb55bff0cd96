"""A node's facts answer is untrusted: parsed once, where a backend receives it, into one typed value.

A malformed or hostile answer (wrong types, huge lists, not an object, NaN) is a clear problem of that
node, naming the field and never echoing the value; absent keys take the defaults the readers had.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from launcher.backends import cluster_spec, load_cluster, plan_job
from launcher.backends.base import StartContext
from launcher.backends.facts import KERNEL_LOG_LIMIT, NAME_LIMIT, NAMES_LIMIT, FactsError, NodeFacts
from launcher.backends.local.backend import LocalBackend
from launcher.backends.nodechecks import node_problems, parse_facts
from launcher.backends.slurm.backend import SlurmBackend
from launcher.backends.ssh.survey import HostReport
from launcher.run.check import report_json, report_table
from launcher.run.checks import CheckReport, assess, gather, version_differences
from launcher.spec.load import load_job

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-value"

HOSTILE = [
    ({"missing": "torch"}, "missing"),
    ({"missing": [SECRET] * (NAMES_LIMIT + 1)}, "missing: List should have at most"),
    ({"gpus": [{"name": "A800", "total_mb": SECRET}]}, "gpus.0.total_mb"),
    ({"gpus": [{"name": "x"}] * 100_000}, "gpus: List should have at most"),
    ({"kernel_log": [SECRET] * (KERNEL_LOG_LIMIT + 1)}, "kernel_log"),
    ({"cpus": "4"}, "cpus"),
    ({"cpus": True}, "cpus"),
    ({"mem_total_bytes": -1}, "mem_total_bytes"),
    ({"mem_total_bytes": 10**40}, "mem_total_bytes"),
    ({"disk_free_gb": float("nan")}, "disk_free_gb"),
    ({"workdir_ok": "yes"}, "workdir_ok"),
    ({"hostname_resolves": 7}, "hostname_resolves: wrong type"),
    ({"container": [SECRET]}, "container"),
    ({"pythons": [{"path": "/p", "version": "3.11", "imports_torch": SECRET}]}, "pythons.0.imports_torch"),
    ({"hcas": {SECRET: 1}}, "hcas"),
]


@pytest.mark.parametrize(("raw", "named"), HOSTILE)
def test_a_hostile_answer_is_an_error_naming_the_field_never_its_value(raw, named) -> None:
    with pytest.raises(FactsError) as caught:
        NodeFacts.parse(raw)
    message = str(caught.value)
    assert message.startswith("malformed facts answer: ") and named in message
    assert SECRET not in message and "\n" not in message and len(message) < 400


@pytest.mark.parametrize("raw", [None, [], "facts", 3, b"{}"])
def test_an_answer_that_is_not_an_object_is_an_error(raw) -> None:
    with pytest.raises(FactsError, match="a JSON object was expected"):
        NodeFacts.parse(raw)
    with pytest.raises(FactsError, match="not JSON"):
        NodeFacts.from_json('{"hostname": ')
    with pytest.raises(FactsError, match="not JSON|nested too deeply"):
        NodeFacts.from_json("[" * 100_000)


def test_many_wrong_fields_are_summed_up_in_one_line() -> None:
    bad = {key: SECRET for key in ("cpus", "workdir_ok", "gpus", "missing", "port_free")}
    message = str(pytest.raises(FactsError, NodeFacts.parse, bad).value)
    assert message.endswith("(and 2 more)") and message.count(";") == 2 and SECRET not in message


def test_absent_keys_take_the_defaults_and_unknown_keys_are_ignored() -> None:
    facts = NodeFacts.parse({"future_key": {"nested": [1, 2]}, "hostname": "n1"})
    assert facts.hostname == "n1" and facts.workdir_ok is True and facts.missing == () and facts.gpus == ()
    assert facts.port_free is None and facts.time is None and facts.container is None
    assert facts.as_json() == {"hostname": "n1"}


def test_strings_are_bounded_and_names_kept_to_one_line() -> None:
    facts = NodeFacts.parse({"hostname": "h" * 10_000, "dev": "eth0\n# injected", "hcas": ["mlx5_0\r\nx"],
                             "route_error": "line one\nline two", "kernel_log": ["k" * 100_000]})
    assert len(facts.hostname or "") == NAME_LIMIT and facts.dev == "eth0 # injected" and facts.hcas == ("mlx5_0 x",)
    assert facts.route_error == "line one\nline two" and len(facts.kernel_log[0]) < 100_000


def test_a_well_formed_answer_reads_as_before() -> None:
    raw = {"hostname": "gpu-01", "python": "3.11.7", "executable": "/usr/bin/python3", "torch": "2.3.1",
           "deepspeed": None, "nccl": "2.20.5", "launch": None, "cpus": 64, "mem_total_bytes": 2**40,
           "mem_available_bytes": 2**39, "missing": [], "workdir_ok": True, "disk_free_gb": 812.5,
           "missing_ifaces": [], "hcas": ["mlx5_0", "mlx5_1"], "hostname_resolves": True,
           "gpus": [{"name": "A800", "driver": "535.1", "total_mb": 81920.0, "used_mb": 3.0}] * 8,
           "gpu_error": None, "gpu_processes": 0, "dev": "ib0", "source": "10.0.0.1", "route_error": None,
           "port_free": True, "time": 1700000000.25}
    facts = NodeFacts.parse(raw)
    assert facts.hcas == ("mlx5_0", "mlx5_1") and len(facts.gpus) == 8 and facts.gpus[0].total_mb == 81920.0
    assert facts.as_json() == raw
    assert NodeFacts.from_json(json.dumps(raw)) == facts


def _plan():
    job = load_job(ROOT / "jobs" / "bert_large_zero3.yaml")
    cluster = load_cluster(ROOT / "examples" / "clusters" / "a800.yaml")
    return cluster, plan_job(job, cluster, "facts-1", rdzv_port=29500)


def test_a_backend_reports_a_malformed_answer_as_that_nodes_problem(monkeypatch) -> None:
    _, plan = _plan()
    backend = LocalBackend(cluster_spec(name="local"))
    monkeypatch.setattr(backend, "node_command", lambda *args, **kwargs: ({"gpus": "lots", "missing": 5}, None))
    found = backend.preflight(plan)
    assert found.facts == {} and len(found.problems) == 1
    assert found.problems[0].startswith("localhost: malformed facts answer: ") and "gpus" in found.problems[0]
    assert parse_facts("n1", ["x"]) == (None, "n1: malformed facts answer: a JSON object was expected, not a list")
    monkeypatch.setattr(backend, "node_command", lambda *args, **kwargs: ({"kernel_log": [1, 2]}, None))
    assert backend.kernel_log(plan, 0) == []
    monkeypatch.setattr(backend, "node_command", lambda *args, **kwargs: ({"kernel_log": ["oom"]}, None))
    assert backend.kernel_log(plan, 0) == ["oom"]


def test_slurm_facts_files_that_do_not_parse_are_problems_of_their_nodes(tmp_path) -> None:
    cluster, plan = _plan()
    assert plan.nnodes >= 2
    good = {"hostname": "gpu-01", "slurm_node": "gpu-01", "master": "10.0.0.1", "source": "10.0.0.1",
            "dev": "ib0", "hcas": ["mlx5_0"], "missing": [], "workdir_ok": True}
    (tmp_path / "node0.facts.json").write_text(json.dumps(good))
    (tmp_path / "node1.facts.json").write_text('{"hostname": ["not", "a", "name"]}')
    for index in range(2, plan.nnodes):
        (tmp_path / f"node{index}.facts.json").write_text("{truncated")
    backend = SlurmBackend.__new__(SlurmBackend)
    backend.cluster, backend.spec = cluster, SimpleNamespace(gpus_per_node=0)
    job = SimpleNamespace(folder=tmp_path, slurm_id="7", status=lambda fresh=False: pytest.fail("all facts are in"))
    found = backend._gather_facts(plan, job, StartContext(run_dir=tmp_path, secrets={}, grace=1.0))
    assert "node 1: malformed facts answer: hostname: Input should be a valid string" in found.problems
    assert all(f"node {i}: malformed facts answer: not JSON" in found.problems for i in range(2, plan.nnodes))
    assert list(found.facts) == [0] and found.probes[0].interface == "ib0" and found.probes[0].ib_hcas == ("mlx5_0",)


class _CheckBackend:
    """What ``checks.gather`` uses of a backend, answering each node from ``answers``."""

    def __init__(self, answers) -> None:
        self.answers = answers
        self.planning = SimpleNamespace(check_hosts=lambda: [f"h{i}" for i in range(len(answers))],
                                        plan_nodes=lambda count: [SimpleNamespace(address="10.0.0.1")])

    def node_command(self, plan, index, command, request, timeout=60.0):
        return self.answers[index], None


def test_launch_check_lists_a_malformed_node_and_shows_node_text_as_text(monkeypatch) -> None:
    cluster, _ = _plan()
    markup = "[bold red]2.3[/]"
    ok = {"hostname": "h0", "python": "3.11.7", "torch": markup, "deepspeed": None, "nccl": None, "time": None,
          "gpus": [], "disk_free_gb": 3.0, "port_free": True, "gpu_processes": 2, "executable": "/usr/bin/python3"}
    nodes = gather(_CheckBackend([ok, {"reached": ["no"]}, {"torch": "2.3.1", "reached": "refused"}]), cluster, 29500)
    assert nodes[0].skew_s is None and nodes[0].facts.torch == markup
    assert nodes[1].error == "malformed facts answer: reached: wrong type"
    problems, warnings = assess(nodes, cluster)
    assert "h1: malformed facts answer: reached: wrong type" in problems
    assert "h2: cannot reach node 0 on the rendezvous port: refused" in problems
    assert "torch differs between nodes: h0=[bold red]2.3[/], h2=2.3.1" in problems
    assert warnings == ["h0: only 3.0 GB free in the workdir", "h0: 2 process(es) already on the GPUs"]
    report = CheckReport(nodes, problems, warnings)
    assert report_json(report)["nodes"][1] == {"index": 1, "host": "h1", "error": nodes[1].error, "skew_s": None,
                                               "skew_uncertainty_s": None}
    assert report_json(report)["nodes"][0]["torch"] == markup

    from rich.console import Console

    console = Console(width=300, record=True, color_system=None)
    console.print(report_table(report))
    assert markup in console.export_text()


def test_version_differences_and_init_reports_read_typed_facts() -> None:
    same = NodeFacts.parse({"python": "3.11.7", "torch": "2.3.1"})
    assert version_differences({"a": same, "b": same}) == []
    assert version_differences({"a": same, "b": NodeFacts()}) == [
        "python differs between nodes: a=3.11.7, b=None", "torch differs between nodes: a=2.3.1, b=None"]
    report = HostReport.from_facts("h1", "10.0.0.1", NodeFacts.parse(
        {"cpus": 8, "pythons": [{"path": "/usr/bin/python3", "version": "3.11.7", "torch": "2.3.1", "imports_torch": True},
                                {"path": "/bad", "error": "exit 1"}, {"version": "3.12.0"}]}))
    assert [i.path for i in report.interpreters] == ["/usr/bin/python3"] and report.cpus == 8 and report.hostname == "h1"
    with pytest.raises(FactsError, match="cpus"):
        HostReport.from_facts("h1", "10.0.0.1", {"cpus": "eight"})


def test_node_problems_read_a_parsed_answer_as_the_dict_was_read() -> None:
    _, plan = _plan()
    assert node_problems("n", plan, NodeFacts()) == []
    facts = NodeFacts.parse({"hostname_resolves": False, "hostname": "n1", "route_error": "no route", "dev": "eth0"})
    assert node_problems("n", plan, facts) == [
        "n: its hostname 'n1' does not resolve (False); torchrun's c10d rendezvous looks it up: add it to /etc/hosts or DNS"]


def test_an_ssh_host_whose_answer_does_not_parse_is_one_problem_of_that_host() -> None:
    from concurrent.futures import Future

    from launcher.backends.ssh.backend import SSHBackend

    cluster, plan = _plan()
    backend = SSHBackend.__new__(SSHBackend)
    backend.cluster = cluster
    backend._pool = SimpleNamespace(get=lambda target, on_peer=None: SimpleNamespace(peer_address=lambda: "10.0.0.2"))
    backend.targets = [SimpleNamespace(alias=f"gpu-0{i}") for i in range(plan.nnodes)]
    backend._held_probe = lambda *args, **kwargs: ({"hcas": "mlx5_0", "dev": "ib0"}, None)  # the job starts at once
    master: Future = Future()
    master.set_result("10.0.0.1")
    address, network, problems, facts = backend._check(plan, 1, cluster.nodes[1], master)
    assert problems == ["gpu-01: malformed facts answer: hcas: Input should be a valid list"]
    assert facts == NodeFacts() and network.interface == ""
    backend._held_probe = lambda *args, **kwargs: ({"hcas": ["mlx5_0"], "dev": "ib0"}, None)
    address, network, problems, facts = backend._check(plan, 1, cluster.nodes[1], master)
    assert network.interface == "ib0" and network.ib_hcas == ("mlx5_0",) and facts.dev == "ib0"


class _Clock:
    """A node whose `date` answers ``skew`` seconds ahead of this machine, ``trips`` seconds after being asked, on a
    clock of the test's own (``time``, put in place of launch's): a loaded machine's late wake-ups change nothing."""

    def __init__(self, skew: float, trips: list[float]) -> None:
        self.skew, self.trips, self.now = skew, list(trips), 1_000_000.0

    def time(self) -> float:
        return self.now

    def run_on_node(self, plan, index, argv, timeout):
        assert argv == ["date", "+%s.%N"]
        trip = self.trips.pop(0)
        answered = self.now + trip / 2 + self.skew  # read half-way, on the node's clock
        self.now += trip
        return SimpleNamespace(code=0, out=f"{answered:.9f}\n", err="")


def test_clock_skew_is_read_on_launchs_own_round_trips_and_warned_of_only_beyond_their_uncertainty(monkeypatch) -> None:
    """Issue 34: `launch check` warned of a 4 s skew between hosts sharing one clock, from the facts' round trip in
    which node 0 waits for its peers' port test. Read on short trips of its own, the skew is the shortest's."""
    from launcher.run import checks
    from launcher.run.checks import Skew, measure_skew

    def measured(node: _Clock) -> Skew | None:
        monkeypatch.setattr(checks, "time", node)
        return measure_skew(node, 0)

    shared = measured(_Clock(0.0, [0.2, 0.02, 0.1]))
    assert shared is not None and abs(shared.seconds) < 1e-6 and shared.uncertainty == pytest.approx(0.01)
    assert not shared.beyond(2.0)
    ahead = measured(_Clock(5.0, [0.02, 0.02, 0.02]))
    assert ahead is not None and abs(ahead.seconds - 5.0) < 0.02 and ahead.beyond(2.0)
    # the facts' own trip (8 s of port test, the node's clock read at its end): 4 s "skew", 4 s uncertain
    waited = Skew.on_trip(108.0, 100.0, 108.0)
    assert (waited.seconds, waited.uncertainty) == (4.0, 4.0) and not waited.beyond(2.0)
    no_date = SimpleNamespace(run_on_node=lambda *args, **kw: SimpleNamespace(code=127, out="", err="date: not found"))
    assert measure_skew(no_date, 0) is None
