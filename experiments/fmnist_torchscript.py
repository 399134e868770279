#!/usr/bin/env python3
"""Exports the McMahan et al. MLP (784-200-200-10) as TorchScript for experiments/fmnist_torchscript.yaml.

    python3 experiments/fmnist_torchscript.py fmnist_mlp.pt

fax trains the module's named_parameters() from the values saved in the file. Any nn.Module whose
forward maps a batch of inputs [B, ...] to logits [B, classes] works the same way; --init FILE.h5
starts from the parameters of a fax MLP (its leaves lN.w [in, out] and lN.b, as in a run log's
/checkpoints/<round>/params), which is how the tests compare this module with fax's built-in mlp.
"""
import argparse

import torch
from torch import nn


class Mlp(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, x):
        h = x.flatten(1)
        for i, layer in enumerate(self.layers):
            if i > 0:
                h = torch.relu(h)
            h = layer(h)
        return h


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="the .pt file to write")
    parser.add_argument("--sizes", default="784,200,200,10", help="inputs, hidden widths, classes")
    parser.add_argument("--init", help="an HDF5 file with fax MLP leaves l0.w, l0.b, ... to start from")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model = Mlp([int(s) for s in args.sizes.split(",")])
    if args.init:
        import h5py
        with h5py.File(args.init, "r") as f:
            with torch.no_grad():
                for i, layer in enumerate(model.layers):
                    layer.weight.copy_(torch.from_numpy(f[f"l{i}.w"][()]).t())
                    layer.bias.copy_(torch.from_numpy(f[f"l{i}.b"][()]))
    torch.jit.script(model).save(args.output)


if __name__ == "__main__":
    main()
