#!/usr/bin/env python3
"""Writes a FEMNIST-like LEAF data set for timing the LEAF reader: OUT/train/all_data_{0,1}.json
and OUT/test/all_data_0.json, in LEAF's schema and number format (pixels as Python floats: 1.0 for
the background, ink as k/255 with 17 digits), users of 200 images of 784 pixels, labels 0..61.
The default (360 training users) writes 1.0 GB of training JSON.

    leaf_femnist_like.py OUT [--users 360]
"""
import argparse, json, os, random

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--users", type=int, default=360)
args = parser.parse_args()
random.seed(0)
values = [repr(1.0)] * 6 + [repr(k / 255) for k in range(0, 255, 7)]
pool = ["[" + ", ".join(random.choice(values) for _ in range(784)) + "]" for _ in range(500)]


def write(path, users, per_user):
    names = [f"f{u:04d}_{u % 100:02d}" for u in users]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write('{"users": ' + json.dumps(names) + ', "num_samples": ' + json.dumps([per_user] * len(names)) +
                ', "user_data": {')
        for i, name in enumerate(names):
            xs = ", ".join(random.choice(pool) for _ in range(per_user))
            ys = ", ".join(str(random.randrange(62)) for _ in range(per_user))
            f.write(("" if i == 0 else ", ") + json.dumps(name) + ': {"x": [' + xs + '], "y": [' + ys + ']}')
        f.write("}}")


half = (args.users * 25 + 35) // 36  # LEAF splits a data set over several files
write(os.path.join(args.out, "train", "all_data_0.json"), range(0, half), 200)
write(os.path.join(args.out, "train", "all_data_1.json"), range(half, args.users), 200)
write(os.path.join(args.out, "test", "all_data_0.json"), range(100), 20)
