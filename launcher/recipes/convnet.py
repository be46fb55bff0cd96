"""The small CIFAR-10 ConvNet used for strategy comparisons and smoke runs.

conv 3->32 k3, ReLU, maxpool 2; conv 32->64 k3, ReLU, maxpool 2;
flatten 2304 -> fc 128 -> ReLU -> fc 10 (315,722 parameters).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvNet(nn.Module):
    """Two conv blocks and two fully connected layers for 3x32x32 images."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, kernel_size=3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=3),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * 6 * 6, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images))


def build_model() -> nn.Module:
    """A freshly initialised ConvNet (seed torch beforehand for reproducibility)."""
    return ConvNet()


def compute_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of the model's logits against the batch labels."""
    return F.cross_entropy(model(batch["images"]), batch["labels"])


def shard_units(model: nn.Module) -> list[nn.Module]:
    """Submodules that FSDP2 shards separately (the root is sharded last)."""
    return []
