"""ResNet-50 for 3x224x224 images, 1000 classes.

Uses ``torchvision.models.resnet50`` when torchvision imports; otherwise an
equivalent built here: the same Bottleneck (v1.5: stride on the 3x3 conv),
stages [3, 4, 6, 3], the same module names (so state dicts are
interchangeable) and the same initialisation, 25,557,032 parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

EXPANSION = 4


def torchvision_available() -> bool:
    """Whether torchvision imports beside this torch build."""
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError, OSError):
        return False
    return True


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride), 1x1 expand, plus the shortcut."""

    def __init__(self, in_ch: int, width: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, width * EXPANSION, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(width * EXPANSION)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    """torchvision's ResNet-50 layout, without torchvision."""

    def __init__(self, num_classes: int = 1000, blocks: tuple[int, ...] = (3, 4, 6, 3)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self._in_ch = 64
        self.layer1 = self._stage(64, blocks[0], stride=1)
        self.layer2 = self._stage(128, blocks[1], stride=2)
        self.layer3 = self._stage(256, blocks[2], stride=2)
        self.layer4 = self._stage(512, blocks[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * EXPANSION, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def _stage(self, width: int, blocks: int, stride: int) -> nn.Sequential:
        out_ch = width * EXPANSION
        downsample = None
        if stride != 1 or self._in_ch != out_ch:
            downsample = nn.Sequential(
                nn.Conv2d(self._in_ch, out_ch, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_ch),
            )
        layers = [Bottleneck(self._in_ch, width, stride, downsample)]
        self._in_ch = out_ch
        layers += [Bottleneck(out_ch, width) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build_model() -> nn.Module:
    """ResNet-50, from torchvision when it imports, else the local equivalent."""
    if torchvision_available():
        from torchvision.models import resnet50

        return resnet50(weights=None)
    return ResNet50()


def compute_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of the model's logits against the batch labels."""
    return F.cross_entropy(model(batch["images"]), batch["labels"])


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The four stages, each sharded separately by FSDP2."""
    return [getattr(model, name) for name in ("layer1", "layer2", "layer3", "layer4")]  # ours or torchvision's
