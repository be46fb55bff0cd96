"""GPT-2 causal language model from a transformers config (random init, no hub)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from launcher.catalog.recipes import GPT2_MAX_POSITIONS, GPT2_VOCAB, transformer_shape


def make_config(size: str | None = None, num_layers: int | None = None):
    """The ``GPT2Config`` for a named size, with an optional layer-count override."""
    from transformers import GPT2Config

    _, hidden, layers, heads, inner = transformer_shape("gpt2", size, num_layers)
    return GPT2Config(
        vocab_size=GPT2_VOCAB,
        n_positions=GPT2_MAX_POSITIONS,
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        n_inner=inner,
    )


def build_model(size: str | None = None, num_layers: int | None = None) -> nn.Module:
    """A randomly initialised ``GPT2LMHeadModel``.

    Built through ``AutoModelForCausalLM.from_config`` so that, when the strategy has
    registered an ``HfDeepSpeedConfig`` for ZeRO-3, transformers partitions it
    while constructing it.
    """
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(make_config(size, num_layers))


def compute_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Next-token loss (transformers shifts the labels inside the model)."""
    return model(**batch).loss


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks, each sharded separately by FSDP2."""
    transformer: Any = model.transformer  # transformers' GPT2Model: torch types submodules as Tensor | Module
    return list(transformer.h)
