"""DeepSpeed configuration for the ZeRO strategies: build it, merge a user's, validate it.

The ZeRO stage and offload come from the strategy's entry in ``launcher.catalog.strategies``.

``make_ds_config`` is pure (no deepspeed import) so the planner can render
the exact config each rank receives. ``validate_with_deepspeed`` runs
DeepSpeed's own config classes over it; it imports deepspeed lazily.
"""

from __future__ import annotations

import copy
from typing import Any

from launcher.catalog.strategies import PRECISIONS, REGISTRY, Strategy, names

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
# DeepSpeed prints its own step summary every ``steps_per_print`` steps; the
# launcher's reporter already does that, so keep DeepSpeed quiet.
QUIET_STEPS_PER_PRINT = 10**9


class DSConfigError(ValueError):
    """A DeepSpeed config request that cannot be honoured (the message says why)."""


def make_ds_config(
    strategy: str,
    precision: str,
    micro_batch: int,
    grad_accum: int,
    world_size: int,
    gradient_clipping: float = 1.0,
    user_config: dict | None = None,
) -> dict:
    """The DeepSpeed config for a ZeRO strategy, with ``user_config`` deep-merged over it.

    ``train_batch_size`` is ``micro_batch * grad_accum * world_size``. A user
    value for a batch key, the ZeRO stage or the precision that contradicts
    the job raises DSConfigError naming both values; ``"auto"`` takes ours.
    """
    chosen = REGISTRY.get(strategy)
    if chosen is None or not chosen.uses_deepspeed or chosen.zero_stage is None:
        raise DSConfigError(f"strategy {strategy!r} does not use DeepSpeed; choose one of "
                            f"{', '.join(names(lambda s: s.uses_deepspeed))}")
    if precision not in PRECISIONS:
        raise DSConfigError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    for label, value in (("micro_batch", micro_batch), ("grad_accum", grad_accum), ("world_size", world_size)):
        if value < 1:
            raise DSConfigError(f"{label} must be >= 1, got {value}")
    config = _base_config(chosen, chosen.zero_stage, precision, micro_batch, grad_accum, world_size, gradient_clipping)
    if not user_config:
        return config
    _check_user_batch(user_config, config, micro_batch, grad_accum, world_size)
    _check_user_stage_and_precision(user_config, chosen, precision)
    return _deep_merge(config, _drop_auto(user_config))


def _base_config(
    strategy: Strategy, stage: int, precision: str, micro_batch: int, grad_accum: int, world_size: int,
    gradient_clipping: float,
) -> dict:
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 5e8,
    }
    if stage < 3:
        zero["allgather_bucket_size"] = 5e8
    if strategy.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if stage == 3:  # parameters offload only at stage 3
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config: dict[str, Any] = {
        "train_batch_size": micro_batch * grad_accum * world_size,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": gradient_clipping,
        "zero_optimization": zero,
        "steps_per_print": QUIET_STEPS_PER_PRINT,
        "wall_clock_breakdown": False,
    }
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        config["fp16"] = {
            "enabled": True,
            "loss_scale": 0,
            "initial_scale_power": 15,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "min_loss_scale": 1,
        }
    return config


def entrypoint_ds_config(precision: str, batch, gradient_clipping: float, user_config: dict | None) -> dict:
    """The DeepSpeed config for a user's program under the DeepSpeed launcher (``LAUNCH_DS_CONFIG``).

    The job's batch numbers (when given), precision and clipping, with ``user_config`` deep-merged
    over them; its ZeRO stage and other sections are the program's own. A user value that
    contradicts the job's batch arithmetic raises DSConfigError naming both.
    """
    config: dict[str, Any] = {"gradient_clipping": gradient_clipping, "steps_per_print": QUIET_STEPS_PER_PRINT}
    if batch is not None:
        config.update(train_batch_size=batch.global_batch, train_micro_batch_size_per_gpu=batch.micro_batch,
                      gradient_accumulation_steps=batch.grad_accum)
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 15}
    if not user_config:
        return config
    if batch is not None:
        _check_user_batch(user_config, config, batch.micro_batch, batch.grad_accum, batch.world_size)
    return _deep_merge(config, _drop_auto(user_config))


def _check_user_batch(user: dict, ours: dict, micro_batch: int, grad_accum: int, world_size: int) -> None:
    arithmetic = (
        f"micro_batch {micro_batch} x grad_accum {grad_accum} x world_size {world_size} "
        f"= {ours['train_batch_size']}"
    )
    for key in BATCH_KEYS:
        value = user.get(key, "auto")
        if value != "auto" and value != ours[key]:
            raise DSConfigError(
                f"deepspeed config {key}={value} contradicts the job's {key}={ours[key]} ({arithmetic})"
            )


def _check_user_stage_and_precision(user: dict, strategy: Strategy, precision: str) -> None:
    stage = user.get("zero_optimization", {}).get("stage", "auto")
    if stage != "auto" and stage != strategy.zero_stage:
        raise DSConfigError(
            f"deepspeed config zero_optimization.stage={stage} contradicts strategy {strategy.name} "
            f"(stage {strategy.zero_stage})"
        )
    for section in ("bf16", "fp16"):
        enabled = user.get(section, {}).get("enabled", "auto")
        if enabled != "auto" and bool(enabled) != (precision == section):
            raise DSConfigError(
                f"deepspeed config {section}.enabled={enabled} contradicts precision {precision}"
            )


def _drop_auto(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_auto(v) for k, v in value.items() if v != "auto"}
    return value


def _deep_merge(base: dict, override: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def validate_with_deepspeed(config: dict) -> list[str]:
    """Problems DeepSpeed's own config classes find in ``config`` ([] when none).

    Runs ``deepspeed.runtime.config.DeepSpeedConfig`` (its pydantic models for
    the ZeRO, fp16 and bf16 sections and its sanity checks). DeepSpeed checks
    the batch product against the current process's world size, so the
    ``train_batch_size`` arithmetic is checked here instead. Raises
    ImportError when deepspeed is not installed.
    """
    from deepspeed.runtime.config import DeepSpeedConfig
    from pydantic import ValidationError

    problems = _batch_problems(config) + _shape_problems(config)
    world_free = {k: v for k, v in config.items() if k != "train_batch_size"}
    try:
        DeepSpeedConfig(world_free)
    except ValidationError as exc:
        model = exc.title
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"])
            problems.append(f"{model}: {where}: {error['msg']}")
    except (AssertionError, ValueError, TypeError, KeyError) as exc:
        problems.append(str(exc) or type(exc).__name__)
    return problems


def main() -> None:
    """``python -m launcher.plan.dsconfig CONFIG_JSON`` prints DeepSpeed's problems with the config as JSON.

    Submit runs this in a subprocess, beside its preflight: importing deepspeed
    takes seconds, and the submitting process stays light.
    """
    import json
    import sys

    print(json.dumps(validate_with_deepspeed(json.loads(sys.argv[1]))))


def _batch_problems(config: dict) -> list[str]:
    values = {key: config.get(key) for key in BATCH_KEYS}
    bad = [f"{key} must be a positive integer, got {v!r}" for key, v in values.items()
           if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1)]
    if bad:
        return bad
    total, micro, accum = (values[key] for key in BATCH_KEYS)
    if total is not None and micro is not None and accum is not None and total % (micro * accum):
        return [f"train_batch_size {total} is not a multiple of micro batch {micro} x accumulation {accum}"]
    return []


def _shape_problems(config: dict) -> list[str]:
    problems = []
    clipping = config.get("gradient_clipping", 0.0)
    if isinstance(clipping, bool) or not isinstance(clipping, (int, float)) or clipping < 0:
        problems.append(f"gradient_clipping must be a non-negative number, got {clipping!r}")
    zero = config.get("zero_optimization", {})
    if isinstance(zero, dict) and zero.get("stage") != 3 and zero.get("offload_param", {}).get("device", "none") != "none":
        problems.append("zero_optimization.offload_param needs ZeRO stage 3")
    return problems


if __name__ == "__main__":
    main()
