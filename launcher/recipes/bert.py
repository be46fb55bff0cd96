"""BERT masked-language model from a transformers config (random init, no hub).

Under ZeRO-3, ``strategies`` registers an ``HfDeepSpeedConfig`` first, so
transformers runs ``deepspeed.zero.Init`` itself (suppressing ``_init_weights``
while partitioning, then re-initialising gathered weights); a raw
``zero.Init()`` around ``BertForMaskedLM(cfg)`` crashes in ``_init_weights``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from launcher.catalog.recipes import (
    BERT_MAX_POSITIONS,
    BERT_TYPE_VOCAB,
    BERT_VOCAB,
    transformer_shape,
)


def make_config(size: str | None = None, num_layers: int | None = None):
    """The ``BertConfig`` for a named size, with an optional layer-count override."""
    from transformers import BertConfig

    _, hidden, layers, heads, inner = transformer_shape("bert", size, num_layers)
    return BertConfig(
        vocab_size=BERT_VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=inner,
        max_position_embeddings=BERT_MAX_POSITIONS,
        type_vocab_size=BERT_TYPE_VOCAB,
    )


def build_model(size: str | None = None, num_layers: int | None = None) -> nn.Module:
    """A randomly initialised ``BertForMaskedLM``.

    Built through ``AutoModelForMaskedLM.from_config`` so that, when the strategy has
    registered an ``HfDeepSpeedConfig`` for ZeRO-3, transformers partitions it
    while constructing it.
    """
    from transformers import AutoModelForMaskedLM

    return AutoModelForMaskedLM.from_config(make_config(size, num_layers))


def compute_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Masked-LM loss (labels are -100 except at masked positions)."""
    return model(**batch).loss


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The encoder layers, each sharded separately by FSDP2."""
    bert: Any = model.bert  # transformers' BertModel: torch types submodules as Tensor | Module
    return list(bert.encoder.layer)
