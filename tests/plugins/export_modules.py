#!/usr/bin/env python3
"""Writes the TorchScript modules the TorchScript model tests load: export_modules.py KIND OUT.pt

bn:          dense, BatchNorm1d, ReLU, dense on 12 features, 3 classes (running statistics: buffers)
custom_loss: a dense layer on 12 features whose loss(logits, labels) is twice the cross-entropy
tensor:      not a module: a tensor saved with torch.save
bn_counter:  bn with BatchNorm1d(momentum=None), whose statistics read the num_batches_tracked counter
dropout:     a dense layer and dropout (random numbers: refused)
tied:        two dense layers sharing one weight (refused)
"""
import sys

import torch
from torch import nn
import torch.nn.functional as F


class Bn(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 8)
        self.norm = nn.BatchNorm1d(8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


class BnCounter(Bn):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(8, momentum=None)


class Dropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 3)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.fc(x))


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(12, 12)
        self.b = nn.Linear(12, 12)
        self.b.weight = self.a.weight
        self.out = nn.Linear(12, 3)

    def forward(self, x):
        return self.out(self.b(torch.relu(self.a(x))))


class CustomLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        return self.fc(x)

    @torch.jit.export
    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return 2.0 * F.cross_entropy(logits, labels, reduction="none")


def main():
    kind, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    if kind == "tensor":
        torch.save(torch.zeros(3), out)
        return
    module = {"bn": Bn, "bn_counter": BnCounter, "custom_loss": CustomLoss, "dropout": Dropout, "tied": Tied}[kind]()
    torch.jit.script(module).save(out)


if __name__ == "__main__":
    main()
