"""LeNet-5 and ResNet-20 in PyTorch, layer for layer as in models/, for bench/cpu/peers.py."""

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn


class LeNet5(nn.Module):
  """models/lenet.py: pad to 32x32, conv 6@5x5 - pool - conv 16@5x5 - pool - 120 - 84 - 10."""

  def __init__(self, channels=1):
    super().__init__()
    self.conv1 = nn.Conv2d(channels, 6, 5)
    self.conv2 = nn.Conv2d(6, 16, 5)
    self.fc1 = nn.Linear(16 * 5 * 5, 120)
    self.fc2 = nn.Linear(120, 84)
    self.logits = nn.Linear(84, 10)

  def forward(self, x):
    pad = (32 - x.shape[-1]) // 2
    x = F.pad(x, (pad, pad, pad, pad))
    x = F.max_pool2d(F.relu(self.conv1(x)), 2)
    x = F.max_pool2d(F.relu(self.conv2(x)), 2)
    x = torch.flatten(x, 1)
    return self.logits(F.relu(self.fc2(F.relu(self.fc1(x)))))


class BasicBlock(nn.Module):
  """models/resnet.py's block, with the option A shortcut."""

  def __init__(self, inputs, channels, stride):
    super().__init__()
    self.conv1 = nn.Conv2d(inputs, channels, 3, stride, 1, bias=False)
    self.bn1 = nn.BatchNorm2d(channels)
    self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
    self.bn2 = nn.BatchNorm2d(channels)
    self.stride, self.extra = stride, channels - inputs

  def forward(self, x):
    y = F.relu(self.bn1(self.conv1(x)))
    y = self.bn2(self.conv2(y))
    if self.stride != 1 or self.extra:
      x = x[:, :, :: self.stride, :: self.stride]
      x = F.pad(x, (0, 0, 0, 0, self.extra // 2, self.extra - self.extra // 2))
    return F.relu(x + y)


class ResNet20(nn.Module):
  def __init__(self):
    super().__init__()
    self.conv = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
    self.bn = nn.BatchNorm2d(16)
    blocks, inputs = [], 16
    for stage, width in enumerate((16, 32, 64)):
      for block in range(3):
        blocks.append(BasicBlock(inputs, width, 2 if stage > 0 and block == 0 else 1))
        inputs = width
    self.blocks = nn.Sequential(*blocks)
    self.logits = nn.Linear(64, 10)

  def forward(self, x):
    x = F.relu(self.bn(self.conv(x)))
    x = self.blocks(x)
    return self.logits(x.mean(dim=(2, 3)))


def build(name: str) -> nn.Module:
  return {"lenet5": LeNet5, "resnet20": ResNet20}[name]()
