#!/usr/bin/env python3
"""Exports a bag-of-embeddings tweet classifier as TorchScript for LEAF's Sent140 (data.name: leaf).

    python3 experiments/sent140_torchscript.py sent140_bag.pt [--vocab 10002] [--width 64]

fax's leaf reader turns each tweet into `data.sequence_length` word ids below the vocabulary size
it prints (`data.vocab` words + 2: id 0 pads, id 1 stands for any other word): --vocab must be at
least that size. The module averages the embeddings of the tweet's words (padding excluded) and
maps them to the two sentiment classes: logits [B, 2] for inputs [B, words].
"""
import argparse

import torch
from torch import nn


class BagOfEmbeddings(nn.Module):
    def __init__(self, vocab: int, width: int, classes: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.out = nn.Linear(width, classes)

    def forward(self, x):
        words = (x != 0).to(self.out.weight.dtype).unsqueeze(2)
        mean = (self.embed(x) * words).sum(1) / words.sum(1).clamp(min=1.0)
        return self.out(mean)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="the .pt file to write")
    parser.add_argument("--vocab", type=int, default=10002, help="word ids the data set uses (data.vocab + 2)")
    parser.add_argument("--width", type=int, default=64, help="embedding width")
    parser.add_argument("--classes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.jit.save(torch.jit.script(BagOfEmbeddings(args.vocab, args.width, args.classes)), args.output)


if __name__ == "__main__":
    main()
