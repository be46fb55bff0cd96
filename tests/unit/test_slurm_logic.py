"""The Slurm backend's pure parts: the spec's time limits and options, the sbatch command, and reading
squeue/scontrol/sinfo output (in the formats tools/SLURM-NOTES.md recorded from a real Slurm)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from launcher.backends import cluster_spec, load_cluster, plan_job
from launcher.backends.slurm import commands as cli
from launcher.backends.slurm.backend import batch_script
from launcher.backends.slurm.spec import SlurmSpec, time_minutes
from launcher.errors import PlanError
from launcher.spec.job import JobSpec

EXAMPLES = sorted(Path("examples/clusters").glob("*.yaml"))


@pytest.mark.parametrize("text, minutes", [
    ("1", 1), ("90", 90), ("0:30", 1), ("10:00", 10), ("10:01", 11), ("2:00:00", 120), ("24:00:00", 1440),
    ("1-0", 1440), ("2-12", 3600), ("1-01:30", 1530), ("1-00:00:01", 1441), ("UNLIMITED", None), ("infinite", None),
])
def test_time_limits_read_as_slurm_reads_them(text, minutes):
    assert time_minutes(text) == minutes


@pytest.mark.parametrize("text", ["0", "0:00", "abc", "1:2:3:4", "-5", "1-", "10 min"])
def test_time_limits_slurm_would_not_take_are_refused(text):
    with pytest.raises(ValueError):
        time_minutes(text)


def test_options_launch_sets_or_that_have_a_key_are_refused_with_the_key_to_use():
    with pytest.raises(ValidationError) as caught:
        SlurmSpec(partition="p", options=["--time=10", "-N2", "--gres=gpu:4", "mem=0", "--output=x"])
    text = str(caught.value)
    assert "--time is set by launch: use slurm.time" in text
    assert "-N is set by launch: use resources.nodes" in text
    assert "use slurm.gpus_per_node and slurm.gpu_flag: gres" in text
    assert "'mem=0' is not an option" in text
    assert "--output is set by launch" in text
    assert SlurmSpec(partition="p", options=["--mem=0", "--reservation=maint", "--exclude=node7"]).options[0] == "--mem=0"


def test_a_slurm_cluster_needs_a_partition_and_a_shared_absolute_workdir():
    with pytest.raises(ValidationError) as caught:
        cluster_spec(name="c", backend="slurm", workdir="relative", setup=["make"])
    text = str(caught.value)
    assert "needs 'slurm: {partition: NAME}'" in text and "needs 'workdir'" in text
    assert "'setup' is not used by backend 'slurm'" in text


def test_sbatch_argv_carries_every_key_and_keeps_the_job_from_being_requeued():
    spec = SlurmSpec(partition="a800", account="proj", qos="high", time="2:00:00", gpus_per_node=8, exclusive=True,
                     constraint="ib&a800", options=["--mem=0"], time_warning=120)
    argv = cli.sbatch_argv(spec, nodes=4, job_name="launch-x-1", output="/w/.launch/x/a0/batch.log", workdir="/w",
                           script="/w/.launch/x/a0/job.sh")
    assert argv == ["sbatch", "--parsable", "--no-requeue", "--nodes=4", "--ntasks-per-node=1", "--job-name=launch-x-1",
                    "--output=/w/.launch/x/a0/batch.log", "--chdir=/w", "--export=ALL", "--partition=a800",
                    "--account=proj", "--qos=high", "--time=2:00:00", "--gpus-per-node=8", "--exclusive",
                    "--constraint=ib&a800", "--signal=B:USR1@120", "--mem=0", "/w/.launch/x/a0/job.sh"]
    gres = cli.sbatch_argv(SlurmSpec(partition="p", gpus_per_node=2, gpu_flag="gres", time_warning=0), nodes=1,
                           job_name="j", output="o", workdir="/w", script="s")
    assert "--gres=gpu:2" in gres and not any(a.startswith("--signal") for a in gres)


def test_the_batch_script_quotes_the_node_command_and_traps_the_warning(tmp_path):
    folder = tmp_path / "a dir"
    text = batch_script(["/opt/py thon", "-c", "print('$(x)')"], folder)
    assert f"trap 'touch '\"'\"'{folder}/time-warning'\"'\"'' USR1" in text
    assert f"'--output={folder}/node%n.step.log' '/opt/py thon' -c 'print('\"'\"'$(x)'\"'\"')' &" in text


@pytest.mark.parametrize("out, expected", [
    ("RUNNING|None|lt-h[1-2]\n", cli.JobStatus(cli.SlurmState.RUNNING, "None", "lt-h[1-2]")),
    ("PENDING|Resources|\n", cli.JobStatus(cli.SlurmState.PENDING, "Resources", "")),
    ("PENDING|ReqNodeNotAvail, UnavailableNodes:lt-h2|\n",
     cli.JobStatus(cli.SlurmState.PENDING, "ReqNodeNotAvail, UnavailableNodes:lt-h2", "")),
    ("NODE_FAIL|NodeDown|lt-h[1-2]\n", cli.JobStatus(cli.SlurmState.NODE_FAIL, "NodeDown", "lt-h[1-2]")),
    ("", cli.JobStatus(cli.SlurmState.GONE, "", "")),
])
def test_squeue_lines_become_statuses(out, expected):
    assert cli.parse_squeue(out) == expected


def test_which_states_have_ended():
    assert [s.value for s in cli.SlurmState if not s.ended] == [
        "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"]
    assert cli.parse_job_id("42;cluster\n") == "42"
    with pytest.raises(cli.SlurmCommandError):
        cli.parse_job_id("sbatch: error: x")


def test_scontrol_key_values_keep_values_with_spaces():
    line = ("JobId=15 JobName=launch-a JobState=TIMEOUT Reason=TimeLimit Dependency=(null) TimeLimit=00:01:00 "
            "Command=/w/job.sh with args NodeList=lt-h[1-2] BatchHost=lt-h1")
    values = cli.parse_key_values(line)
    assert (values["JobState"], values["Reason"], values["TimeLimit"]) == ("TIMEOUT", "TimeLimit", "00:01:00")
    assert values["Command"] == "/w/job.sh with args" and values["NodeList"] == "lt-h[1-2]"


def test_a_partition_and_its_gpus_are_read_from_scontrol_and_sinfo():
    part = cli.parse_partition("PartitionName=test AllowGroups=ALL Default=YES MaxNodes=UNLIMITED MaxTime=30 "
                               "MinNodes=0 State=UP TotalCPUs=2 TotalNodes=2")
    assert part == cli.Partition(name="test", up=True, total_nodes=2, max_nodes=None, max_minutes=30)
    assert cli.parse_partition("PartitionName=p MaxTime=UNLIMITED State=DOWN TotalNodes=8 MaxNodes=4").max_nodes == 4
    assert cli.parse_gres_line("2|gpu:2") == (2, 2)
    assert cli.parse_gres_line("16|gpu:a800:8(S:0-1)") == (16, 8)
    assert cli.parse_gres_line("3|(null)") == (3, 0)


def test_the_plan_has_placeholders_until_slurm_allocates_and_refuses_more_ranks_than_gpus():
    cluster = cluster_spec(name="s", backend="slurm", slurm={"partition": "p", "gpus_per_node": 2}, workdir="/w")
    job = JobSpec.model_validate({"name": "j", "entrypoint": ["python", "t.py"],
                                  "resources": {"nodes": 2, "nproc_per_node": 2}})
    plan = plan_job(job, cluster, "j-1", rdzv_port=29500)
    assert [n.host for n in plan.nodes] == ["slurm-node-0", "slurm-node-1"]
    assert "NCCL_SOCKET_IFNAME" in plan.nodes[1].unprobed and "NCCL_SOCKET_IFNAME" not in plan.nodes[1].env
    too_many = job.model_copy(update={"resources": job.resources.model_copy(update={"nproc_per_node": 4})})
    with pytest.raises(PlanError, match="asks Slurm for 2 GPUs per node"):
        plan_job(too_many, cluster, "j-2", rdzv_port=29500)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_cluster_loads(path):
    cluster = load_cluster(str(path))
    assert cluster.name and cluster.backend in ("ssh", "ray", "slurm", "local")
