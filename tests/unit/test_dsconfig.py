"""DeepSpeed config generation, merging, contradiction checks and DeepSpeed's own validation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.plan.dsconfig import DSConfigError, make_ds_config, validate_with_deepspeed

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("micro, accum, world", [(16, 4, 16), (1, 1, 1), (2, 8, 3), (16, 1, 64)])
def test_train_batch_size_is_micro_times_accum_times_world(micro, accum, world):
    config = make_ds_config("zero2", "bf16", micro, accum, world)
    assert config["train_batch_size"] == micro * accum * world
    assert config["train_micro_batch_size_per_gpu"] == micro
    assert config["gradient_accumulation_steps"] == accum


def test_bert_large_job_numbers():
    config = make_ds_config("zero3", "bf16", 16, 4, 16, gradient_clipping=1.0)
    assert config["train_batch_size"] == 1024
    assert config["gradient_clipping"] == 1.0
    assert config["bf16"] == {"enabled": True}
    assert "fp16" not in config


@pytest.mark.parametrize("strategy, stage, offload", [("zero2", 2, False), ("zero3", 3, False),
                                                      ("zero3_offload", 3, True)])
def test_stage_and_offload_per_strategy(strategy, stage, offload):
    zero = make_ds_config(strategy, "fp32", 1, 1, 2)["zero_optimization"]
    assert zero["stage"] == stage
    assert ("offload_optimizer" in zero) == offload and ("offload_param" in zero) == offload
    if offload:
        assert zero["offload_optimizer"]["device"] == zero["offload_param"]["device"] == "cpu"


def test_precision_sections():
    assert make_ds_config("zero2", "fp16", 1, 1, 1)["fp16"]["initial_scale_power"] == 15
    fp32 = make_ds_config("zero2", "fp32", 1, 1, 1)
    assert "fp16" not in fp32 and "bf16" not in fp32


def test_user_config_deep_merges():
    user = {
        "zero_optimization": {"reduce_bucket_size": 1e7, "stage": 3},
        "steps_per_print": 5,
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    }
    config = make_ds_config("zero3", "bf16", 4, 2, 8, user_config=user)
    assert config["zero_optimization"]["reduce_bucket_size"] == 1e7
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["overlap_comm"] is True  # ours, kept
    assert config["steps_per_print"] == 5
    assert config["train_batch_size"] == 64  # "auto" takes ours
    assert config["optimizer"]["params"]["lr"] == 1e-4
    assert user["train_batch_size"] == "auto"  # the caller's dict is untouched


@pytest.mark.parametrize("user, numbers", [
    ({"train_batch_size": 512}, ("512", "1024")),
    ({"train_micro_batch_size_per_gpu": 8}, ("8", "16")),
    ({"gradient_accumulation_steps": 2}, ("2", "4")),
])
def test_contradicting_batch_size_is_refused_naming_both_numbers(user, numbers):
    with pytest.raises(DSConfigError) as info:
        make_ds_config("zero3", "bf16", 16, 4, 16, user_config=user)
    for number in numbers:
        assert number in str(info.value)


def test_contradicting_stage_or_precision_is_refused():
    with pytest.raises(DSConfigError, match="stage=3 contradicts strategy zero2"):
        make_ds_config("zero2", "bf16", 1, 1, 1, user_config={"zero_optimization": {"stage": 3}})
    with pytest.raises(DSConfigError, match="fp16.enabled=True contradicts precision bf16"):
        make_ds_config("zero2", "bf16", 1, 1, 1, user_config={"fp16": {"enabled": True}})


def test_bad_requests_are_refused():
    with pytest.raises(DSConfigError, match="ddp"):
        make_ds_config("ddp", "bf16", 1, 1, 1)
    with pytest.raises(DSConfigError, match="micro_batch"):
        make_ds_config("zero2", "bf16", 0, 1, 1)


@pytest.mark.parametrize("strategy", ["zero2", "zero3", "zero3_offload"])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_deepspeed_accepts_generated_configs(strategy, precision):
    pytest.importorskip("deepspeed")
    assert validate_with_deepspeed(make_ds_config(strategy, precision, 16, 4, 16)) == []


def test_deepspeed_reports_problems():
    pytest.importorskip("deepspeed")
    config = make_ds_config("zero2", "bf16", 2, 2, 4)
    assert any("stage" in p for p in validate_with_deepspeed({**config, "zero_optimization": {"stage": 7}}))
    assert any("stagee" in p for p in validate_with_deepspeed({**config, "zero_optimization": {"stagee": 2}}))
    assert any("multiple" in p for p in validate_with_deepspeed({**config, "train_batch_size": 10}))
    both = {**config, "fp16": {"enabled": True}}
    assert any("simultaneously" in p for p in validate_with_deepspeed(both))
    offload = {**config, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}
    assert validate_with_deepspeed(offload) == ["zero_optimization.offload_param needs ZeRO stage 3"]


def test_make_ds_config_does_not_import_deepspeed():
    code = ("import sys; from launcher.plan.dsconfig import make_ds_config; make_ds_config('zero3', 'bf16', 1, 1, 2); "
            "sys.exit('deepspeed' in sys.modules or 'torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
