"""The strategy registry: its rules, and every reader taking them from it (spec, plan, memory, bench, recipes)."""

from __future__ import annotations

import argparse
import json

import pytest

from launcher.catalog import strategies
from launcher.catalog.strategies import Family, get_strategy
from launcher.cli.main import main
from launcher.plan.dsconfig import DSConfigError, make_ds_config
from launcher.run.bench import strategy_overrides
from launcher.spec.job import JobSpec

CONVNET = "jobs/cifar10_convnet.yaml"


def _job(**fields) -> JobSpec:
    return JobSpec(name="x", recipe="convnet", batch={"micro_batch": 8}, **fields)


def test_lookup_lists_the_valid_names():
    with pytest.raises(ValueError) as info:
        get_strategy("data_parallel")
    assert str(info.value) == (
        "unknown strategy 'data_parallel'; choose one of ddp_compile, ddp, zero2, zero3, zero3_offload, fsdp2, dp")
    assert strategies.find_strategy("data_parallel") is None


def test_every_family_has_a_trainer():
    from launcher.recipes.strategies import TRAINERS

    assert {s.family for s in strategies.REGISTRY.values()} <= set(TRAINERS)
    assert set(Family) == set(TRAINERS)


def test_spec_accepts_dp_and_refuses_deepspeed_launcher_with_it():
    assert _job(strategy="dp").strategy == "dp"
    assert _job(strategy="zero2", launcher="deepspeed").uses_deepspeed
    assert not _job(strategy="dp").uses_deepspeed
    with pytest.raises(ValueError, match="launcher 'deepspeed' runs the strategies zero2, zero3, zero3_offload; "
                                         "strategy 'dp' runs under 'torchrun'"):
        _job(strategy="dp", launcher="deepspeed")


def test_dp_resource_rules():
    dp = get_strategy("dp")
    assert dp.resource_problems(1, 1) == []
    one_node, one_process = dp.resource_problems(2, 4)
    assert one_node.startswith("resources.nodes:") and "set resources.nodes: 1" in one_node
    assert one_process.startswith("resources.nproc_per_node:") and "set resources.nproc_per_node: 1" in one_process
    assert get_strategy("ddp").resource_problems(4, 8) == []


def test_deepspeed_fp16_needs_a_gpu_and_torch_fp16_does_not():
    zero2 = get_strategy("zero2")
    assert zero2.device_problems("fp16", cuda=True) == []
    assert zero2.device_problems("bf16", cuda=False) == []
    (problem,) = zero2.device_problems("fp16", cuda=False)
    assert "needs a GPU for fp16" in problem and "fp32 or bf16" in problem
    assert get_strategy("dp").device_problems("fp16", cuda=False) == []


def test_dry_run_of_dp_with_one_process_plans_a_world_of_one(home, capsys):
    main(["submit", CONVNET, "--set", "strategy=dp", "--set", "resources.nproc_per_node=1", "--dry-run", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert plan["strategy"] == "dp" and plan["world_size"] == 1
    assert plan["batch"]["global_batch"] == 32 * 2  # micro x accumulation x 1 process
    assert plan["memory"]["strategy"] == "dp"
    argv = plan["nodes"][0]["argv"]
    assert argv[argv.index("--nproc-per-node") + 1] == "1" and argv[argv.index("--strategy") + 1] == "dp"


def test_launch_plan_lists_dp_with_the_replicated_states_of_ddp(capsys):
    main(["plan", "jobs/bert_large_zero3.yaml", "--cluster", "examples/clusters/a800.yaml", "--json"])
    rows = {row["strategy"]: row for row in json.loads(capsys.readouterr().out)["strategies"]}
    assert list(rows) == ["ddp_compile", "ddp", "zero2", "zero3", "zero3_offload", "fsdp2", "dp"]
    assert rows["dp"]["model_states_bytes"] == rows["ddp"]["model_states_bytes"] == 16 * 335_174_458


@pytest.mark.parametrize("launcher, nodes, nproc, strategy, expected", [
    ("torchrun", 1, 2, "dp", ["strategy=dp", "resources.nproc_per_node=1"]),
    ("torchrun", 2, 1, "dp", ["strategy=dp", "resources.nodes=1"]),
    ("torchrun", 1, 1, "dp", ["strategy=dp"]),
    ("deepspeed", 1, 2, "ddp", ["strategy=ddp", "launcher=torchrun"]),
    ("deepspeed", 2, 2, "zero3", ["strategy=zero3"]),
    ("torchrun", 2, 2, "nonsense", ["strategy=nonsense"]),  # refused by the spec as a failed run
])
def test_bench_sets_what_each_strategy_needs(launcher, nodes, nproc, strategy, expected):
    job = _job(strategy="zero2", launcher=launcher, resources={"nodes": nodes, "nproc_per_node": nproc})
    assert strategy_overrides(job, strategy) == expected


def test_deepspeed_config_comes_from_the_registry():
    with pytest.raises(DSConfigError, match="'dp' does not use DeepSpeed; choose one of zero2, zero3, zero3_offload"):
        make_ds_config("dp", "bf16", 1, 1, 1)


def _train_args(*argv: str) -> argparse.Namespace:
    from launcher.recipes.train import build_parser

    return build_parser().parse_args(["--recipe", "convnet", *argv])


def test_rank_refuses_dp_with_two_processes_and_compile_mode_without_compiling():
    from launcher.recipes.train import UsageError, check_args

    assert check_args(_train_args("--strategy", "dp"), 1, 1, cuda=False) is None
    with pytest.raises(UsageError, match="strategy 'dp'.*set resources.nproc_per_node: 1"):
        check_args(_train_args("--strategy", "dp"), 2, 2, cuda=False)
    with pytest.raises(UsageError, match="strategy 'dp'.*set resources.nodes: 1"):
        check_args(_train_args("--strategy", "dp"), 2, 1, cuda=False)
    with pytest.raises(UsageError, match="--compile-mode applies to ddp_compile, not dp"):
        check_args(_train_args("--strategy", "dp", "--compile-mode", "default"), 1, 1, cuda=False)
    with pytest.raises(UsageError, match="needs a GPU for fp16"):
        check_args(_train_args("--strategy", "zero2", "--precision", "fp16"), 1, 1, cuda=False)


def test_bench_help_lists_every_strategy_with_its_description(capsys):
    try:
        main(["bench", "--help"])
    except SystemExit as exc:
        assert exc.code == 0
    out = capsys.readouterr().out
    for strategy in strategies.REGISTRY.values():
        assert strategy.name in out and strategy.description[:40] in out
