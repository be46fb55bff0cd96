"""Memory estimates: DeepSpeed's own estimator numbers, and what recommend() picks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.catalog import strategies
from launcher.catalog.recipes import RecipeInfo, recipe_info
from launcher.plan import memory

REPO = Path(__file__).resolve().parents[2]
# (total params, largest layer params, nodes, GPUs per node)
CASES = [
    (335_174_458, 31_285_050, 1, 8),  # BERT-large
    (1_300_000_000, 80_000_000, 2, 8),
    (10_000_000_000, 500_000_000, 4, 8),
    (124_439_808, 38_597_376, 1, 1),
    (7_000_000_000, 262_144_000, 3, 4),
]


def _info(params: int, largest: int, activation: int = 0, name: str = "gpt2") -> RecipeInfo:
    return RecipeInfo(name=name, params=params, largest_layer_params=largest, flops_per_sample=0.0,
                      tokens_per_sample=0, activation_bytes_per_sample=activation)


@pytest.mark.parametrize("params, largest, nodes, gpus", CASES)
def test_formulas_equal_deepspeed_estimators(params, largest, nodes, gpus):
    stage2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    for offload in (True, False):
        assert strategies.zero2_model_states(params, gpus, nodes, offload) == stage2.estimate_zero2_model_states_mem_needs(
            total_params=params, num_gpus_per_node=gpus, num_nodes=nodes, cpu_offload=offload)
    for offload, offload_params in ((True, True), (True, False), (False, False)):
        for zero_init in (True, False):
            ours = strategies.zero3_model_states(params, largest, gpus, nodes, offload, offload_params, zero_init)
            theirs = stage3.estimate_zero3_model_states_mem_needs(
                total_params=params, largest_layer_params=largest, num_gpus_per_node=gpus, num_nodes=nodes,
                cpu_offload=offload, cpu_offload_params=offload_params, zero_init=zero_init)
            assert ours == theirs


@pytest.mark.parametrize("params, largest, nodes, gpus", CASES)
def test_estimate_uses_deepspeed_numbers(params, largest, nodes, gpus):
    stage2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    info = _info(params, largest)
    est = memory.estimate(info, "zero2", "bf16", 1, nodes, gpus, 80)
    cpu, gpu = stage2.estimate_zero2_model_states_mem_needs(params, gpus, nodes, cpu_offload=False)
    assert (est.model_states_bytes, est.cpu_bytes_per_node) == (gpu, cpu)
    for strategy, offload in (("zero3", False), ("zero3_offload", True)):
        est = memory.estimate(info, strategy, "bf16", 1, nodes, gpus, 80)
        cpu, gpu, _ = stage3.estimate_zero3_model_states_mem_needs(
            params, largest, gpus, nodes, cpu_offload=offload, cpu_offload_params=offload, zero_init=True)
        assert (est.model_states_bytes, est.cpu_bytes_per_node) == (gpu, cpu)


def test_ddp_and_dp_are_sixteen_bytes_a_parameter_at_any_precision():
    info = _info(1_000_000, 10_000)
    for strategy in ("ddp", "ddp_compile", "dp"):
        for precision in ("fp32", "bf16", "fp16"):
            assert memory.estimate(info, strategy, precision, 4, 2, 8, 80).model_states_bytes == 16_000_000


def test_activations_scale_with_micro_batch_and_double_for_fp32():
    info = recipe_info("bert", "large")
    one = memory.estimate(info, "ddp", "bf16", 1, 1, 8, 80)
    many = memory.estimate(info, "ddp", "bf16", 16, 1, 8, 80)
    full = memory.estimate(info, "ddp", "fp32", 16, 1, 8, 80)
    assert many.activation_bytes == 16 * one.activation_bytes == 16 * info.activation_bytes_per_sample
    assert full.activation_bytes == 2 * many.activation_bytes
    assert many.total_bytes == many.model_states_bytes + many.activation_bytes


def test_fits_and_headroom():
    info = _info(1_000_000_000, 100_000_000)
    est = memory.estimate(info, "ddp", "bf16", 1, 1, 1, 80)
    usable = int(80 * memory.GIB * (1 - memory.RESERVED_FRACTION))
    assert est.usable_bytes == usable
    assert est.headroom == usable - est.total_bytes and est.fits
    assert not memory.estimate(info, "ddp", "bf16", 1, 1, 1, 16).fits


def test_estimate_rejects_unknown_names():
    info = recipe_info("convnet")
    with pytest.raises(ValueError, match="unknown strategy 'ddp2'; choose one of .*zero3_offload, fsdp2, dp"):
        memory.estimate(info, "ddp2", "bf16", 1, 1, 1, 80)
    with pytest.raises(ValueError, match="fp8"):
        memory.estimate(info, "ddp", "fp8", 1, 1, 1, 80)


def test_recommend_offloads_a_10b_model_on_80gb():
    info = _info(10_000_000_000, 500_000_000, activation=64 * 2**20)
    for gpus in (1, 2):
        rec = memory.recommend(info, "bf16", 1, 1, gpus, 80)
        assert rec.strategy == "zero3_offload", rec
        assert rec.estimate.fits and "offload" in rec.reason
    # With 2 x 8 GPUs the optimizer states spread thin enough for ZeRO-2.
    assert memory.recommend(info, "bf16", 1, 2, 8, 80).strategy == "zero2"
    # 4 x 8: ZeRO-2 fits too; ZeRO-3 is only needed when ZeRO-2 does not.
    assert memory.recommend(info, "bf16", 1, 4, 8, 80).strategy in ("zero2", "zero3")


def test_recommend_ddp_compile_for_the_convnet():
    info = recipe_info("convnet")
    rec = memory.recommend(info, "fp32", 128, 1, 1, 80)
    assert rec.strategy in ("ddp", "ddp_compile")
    assert "prototype" in rec.reason
    assert "several nodes" in memory.recommend(info, "bf16", 128, 2, 8, 80).reason


def test_recommend_says_when_nothing_fits():
    rec = memory.recommend(_info(10_000_000_000, 9_000_000_000), "bf16", 1, 1, 1, 16)
    assert rec.strategy is None and "nothing fits" in rec.reason


def test_recommendation_order_is_the_documented_one():
    assert memory.RECOMMEND_ORDER == ("ddp_compile", "ddp", "zero2", "zero3", "zero3_offload")


def test_memory_module_does_not_import_torch():
    code = ("import sys, launcher.plan.memory, launcher.catalog.strategies; "
            "sys.exit('torch' in sys.modules or 'deepspeed' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
