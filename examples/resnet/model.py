"""A ResNet-style CNN with basic blocks (He et al. 2016), laid out and named like torchvision's
``resnet18``/``resnet34``.

Modules: ``conv1`` (7x7, stride 2), ``bn1``, ``relu``, ``maxpool``, ``layer1``..``layer4``
(``nn.Sequential`` of basic blocks, each with ``conv1``, ``bn1``, ``relu``, ``conv2``, ``bn2`` and,
where the shape changes, ``downsample`` = Sequential(1x1 conv, BatchNorm)), ``avgpool``
(AdaptiveAvgPool2d(1)), ``fc``. Stage ``i`` has ``width * 2**i`` channels; stages 2-4 halve the
resolution. Convolutions have no bias. ``build()`` is resnet18 (11,689,512 parameters);
``blocks=(3, 4, 6, 3)`` is resnet34.

Input ``images``: float32 ``[batch, 3, H, W]`` (224x224 for ImageNet; any size >= 32 works);
output logits ``[batch, num_classes]``. ``torch.fx.symbolic_trace``-able.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )
        else:
            self.downsample = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, blocks: Sequence[int], width: int, num_classes: int) -> None:
        super().__init__()
        if len(blocks) != 4:
            raise ValueError(f"blocks must give 4 stage depths, got {tuple(blocks)}")
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = width
        for i, n in enumerate(blocks):
            planes = width * 2**i
            stride = 1 if i == 0 else 2
            layer = [BasicBlock(inplanes, planes, stride)]
            layer += [BasicBlock(planes, planes) for _ in range(n - 1)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
            inplanes = planes
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(images))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build(
    blocks: Sequence[int] = (2, 2, 2, 2), width: int = 64, num_classes: int = 1000
) -> ResNet:
    return ResNet(tuple(blocks), width, num_classes)


def example_inputs(batch: int = 2, size: int = 224) -> tuple[torch.Tensor]:
    return (torch.randn(batch, 3, size, size),)


def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against int64 class labels ``[batch]``."""
    return F.cross_entropy(logits, labels)
