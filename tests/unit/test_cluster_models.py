"""Each backend brings its own cluster model (launcher/backends/NAME/spec.py), chosen by ``backend:``: the
cluster files users have today still load, and their errors still name file, line and field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from launcher.backends import BACKENDS, cluster_models, cluster_spec, load_cluster
from launcher.backends.local.spec import LocalCluster
from launcher.backends.ray.spec import RayCluster
from launcher.backends.slurm.spec import SlurmCluster
from launcher.backends.ssh.spec import SSHCluster
from launcher.cli.main import main
from launcher.errors import SpecError
from launcher.spec.cluster import ClusterSpec
from launcher.spec.clusters import ClusterModels
from tests.helpers import ROOT

MODELS = {"local": LocalCluster, "ssh": SSHCluster, "ray": RayCluster, "slurm": SlurmCluster}
FILES = [ROOT / "cluster.yaml", *sorted((ROOT / "examples" / "clusters").glob("*.yaml")),
         *sorted((ROOT / "tests" / "clusters").glob("*.yaml"))]
# A cluster as the store kept it before the sections were split (main's model_dump of an ssh cluster: every
# backend's section, at its defaults): `launch status`, `attach` and `cancel` of such a job read it back.
STORED = {
    "name": "lab", "backend": "ssh",
    "ssh": {"user": None, "port": 22, "key_file": None, "known_hosts": "~/.ssh/known_hosts", "config_file": "~/.ssh/config",
            "jump_host": None, "connect_timeout": 10.0, "fanout": 32},
    "nodes": [{"host": "a", "address": None, "port": None, "user": None, "gpus": 2, "slots": None}],
    "local": {"gpus": None, "slots": None}, "ray": {"address": "auto", "placement_timeout": 60.0, "cpus_per_node": None},
    "slurm": {"partition": None, "account": None, "qos": None, "time": None, "gpus_per_node": 0, "gpu_flag": "gpus-per-node",
              "exclusive": False, "constraint": None, "options": [], "time_warning": 300},
    "gpu": {"name": None, "memory_gb": None, "peak_tflops": None}, "network": {"interface": "auto", "ib_hca": "auto"},
    "rendezvous": {"port": None}, "python": None, "workdir": "/work", "sync_workdir": None, "setup": [], "container": None,
}


def _doc_snippets() -> list[tuple[str, str]]:
    """(where, text) of every YAML block in the docs that is a cluster file (it has a top-level ``backend:``)."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for index, block in enumerate(re.findall(r"```yaml\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S)):
            if re.search(r"^backend:", block, flags=re.M):
                found.append((f"{doc.name}#{index}", block))
    return found


SNIPPETS = _doc_snippets()


def test_the_registry_names_each_backends_own_model() -> None:
    assert cluster_models().models == MODELS
    assert set(BACKENDS) == set(MODELS)
    for name, model in MODELS.items():
        assert model.__module__ == f"launcher.backends.{name}.spec"


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_the_cluster_files_of_the_repository_load_as_their_backends_model(path: Path) -> None:
    cluster = load_cluster(path)
    assert type(cluster) is MODELS[cluster.backend]


def test_launch_validate_takes_every_cluster_file_of_the_repository(capsys) -> None:
    main(["validate", *map(str, FILES)])
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == ["ok"] * len(FILES)


def test_the_docs_show_cluster_files_of_every_backend() -> None:
    backends = {re.search(r"^backend: *(\w+)", text, flags=re.M).group(1) for _, text in SNIPPETS}  # type: ignore[union-attr]
    assert backends == set(MODELS)


@pytest.mark.parametrize("where,text", SNIPPETS, ids=[where for where, _ in SNIPPETS])
def test_the_cluster_files_the_docs_show_load(where: str, text: str, tmp_path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    assert type(load_cluster(path)).__name__.lower().startswith(load_cluster(path).backend)


WRONG_KEYS = [
    ("local", "name: c\nbackend: local\nlocal:\n  slot: 2\n", "cluster.yaml:4: local.slot: unknown key; did you mean 'slots'?"),
    ("ssh", "name: c\nbackend: ssh\nssh:\n  user: root\n  prot: 22\nnodes: [{host: a}]\n",
     "cluster.yaml:5: ssh.prot: unknown key; did you mean 'port'?"),
    ("ray", "name: c\nbackend: ray\nray: {adress: auto}\n", "cluster.yaml:3: ray.adress: unknown key; did you mean 'address'?"),
    ("slurm", "name: c\nbackend: slurm\nworkdir: /w\nslurm:\n  partition: p\n  gpus_per_nod: 8\n",
     "cluster.yaml:6: slurm.gpus_per_nod: unknown key; did you mean 'gpus_per_node'?"),
    ("a node of ssh", "name: c\nbackend: ssh\nnodes:\n  - {host: a}\n  - {hots: b}\n",
     "cluster.yaml:5: nodes.1.hots: unknown key; did you mean 'host'?"),
    ("the top level", "name: c\nbackend: slurm\nworkdri: /w\nslurm: {partition: p}\n",
     "cluster.yaml:3: workdri: unknown key; did you mean 'workdir'?"),
    ("a section's name", "name: c\nbackend: ssh\nnodes: [{host: a}]\nsssh: {}\n", "cluster.yaml:4: sssh: unknown key; did you mean 'ssh'?"),
]


@pytest.mark.parametrize("where,text,expected", WRONG_KEYS, ids=[case[0] for case in WRONG_KEYS])
def test_a_wrong_key_names_file_line_and_field(where: str, text: str, expected: str, tmp_path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as error:
        load_cluster(path)
    assert f"{path.parent}/{expected}" in str(error.value)


def test_each_backends_own_checks_keep_their_messages(tmp_path) -> None:
    cases = {
        "name: c\nbackend: ssh\n": ":1: (top level): backend 'ssh' needs 'nodes': a list of {host: ...}",
        "name: c\nbackend: local\nnodes: [{host: a}]\n": ":1: (top level): backend 'local' runs on this machine",
        "name: c\nbackend: slurm\nslurm: {partition: p}\nsetup: [make]\n": ":1: (top level): backend 'slurm' needs 'workdir'",
        "name: c\nbackend: ssh\nnodes:\n  - {host: a}\n  - {host: a, port: 22}\n":
            ":3: nodes: nodes 0 and 1 are the same node (host a port 22); list each node once",
        "name: c\nbackend: sssh\n": ":2: backend: Input should be 'local', 'ssh', 'ray' or 'slurm' (got 'sssh')",
        "name: c\nbackend: [ssh]\n": ":2: backend: Input should be 'local', 'ssh', 'ray' or 'slurm' (got ['ssh'])",
    }
    for text, expected in cases.items():
        path = tmp_path / "cluster.yaml"
        path.write_text(text)
        with pytest.raises(SpecError) as error:
            load_cluster(path)
        assert f"{path}{expected}" in str(error.value), text


def test_a_section_of_another_backend_is_checked_and_left_out(tmp_path) -> None:
    """A file switched from one backend to another keeps loading; its other section is still checked."""
    path = tmp_path / "cluster.yaml"
    path.write_text("name: c\nbackend: ray\nnodes: [{host: a}]\nssh: {user: root}\nlocal: {slots: 2}\n")
    cluster = load_cluster(path)
    assert type(cluster) is RayCluster and not hasattr(cluster, "ssh")
    path.write_text("name: c\nbackend: ray\nssh:\n  usr: root\nslurm: {time: 0}\n")
    with pytest.raises(SpecError) as error:
        load_cluster(path)
    assert f"{path}:4: ssh.usr: unknown key; did you mean 'user'?" in str(error.value)
    assert f"{path}:5: slurm.time: Input should be a valid string (got 0)" in str(error.value)
    with pytest.raises(SpecError, match=r"--set local.slotz=3: local.slotz: unknown key; did you mean 'slots'\?"):
        load_cluster(path, ["local.slotz=3"])


def test_a_set_backend_changes_the_model(tmp_path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("name: c\nbackend: ssh\nnodes: [{host: a}]\n")
    assert type(load_cluster(path, ["backend=ray"])) is RayCluster


def test_a_cluster_stored_before_the_split_reads_back() -> None:
    cluster = cluster_spec(json.loads(json.dumps(STORED)))
    assert type(cluster) is SSHCluster and cluster.nodes[0].gpus == 2 and cluster.ssh.fanout == 32
    assert cluster_spec(cluster.model_dump(mode="json")) == cluster


def test_no_backend_is_the_local_one_and_a_wrong_one_raises_pydantics_error() -> None:
    assert type(cluster_spec(name="c")) is LocalCluster
    with pytest.raises(ValidationError):
        cluster_spec(name="c", backend="kubernetes")
    with pytest.raises(TypeError, match="the part every backend's cluster model shares"):
        ClusterSpec(name="c")


def test_the_schema_is_one_union_chosen_by_backend(capsys) -> None:
    main(["schema", "cluster"])
    schema = json.loads(capsys.readouterr().out)
    members = [schema["$defs"][ref["$ref"].rsplit("/", 1)[1]] for ref in schema["oneOf"]]
    assert [member["properties"]["backend"]["const"] for member in members] == list(MODELS)
    for member, name in zip(members, MODELS, strict=True):
        assert name in member["properties"] and member["additionalProperties"] is False
    assert "default" in members[0]["properties"]["backend"]  # local: a file without `backend:`


def test_a_registered_model_has_its_backend_literal_and_its_own_section() -> None:
    """The union's tags, the loader's "another backend's section" and `launch schema` rely on it."""
    with pytest.raises(TypeError, match=r"backend: Literal\['kube'\] and a section 'kube'"):
        ClusterModels({"kube": LocalCluster})
    ssh = cluster_spec(name="c", backend="ssh", nodes=[{"host": "a"}])
    assert cluster_spec(ssh) == ssh
