#!/usr/bin/python3
"""Writes small files in TensorFlow Federated's HDF5 schema (/examples/<client>/<feature>) with h5py,
as fed_emnist and shakespeare ship them, for the C++ readers to load.

usage: write_tff_fixture.py DIRECTORY
"""
import os
import sys

import h5py
import numpy as np

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(0)
sizes = {"f0000_12": 5, "f0001_04": 3, "f0002_33": 7}

for name, scale in (("emnist_train.h5", 1), ("emnist_test.h5", 0)):
    with h5py.File(os.path.join(out, name), "w") as f:
        for client, n in sizes.items():
            n = n if scale else 2
            g = f.create_group(f"examples/{client}")
            g.create_dataset("pixels", data=rng.random((n, 28, 28), dtype=np.float32))
            g.create_dataset("label", data=rng.integers(0, 10, n, dtype=np.int32))

# A header that promises 16 GiB of pixels the file does not store (what fuzz_tff_hdf5 found): the
# reader must refuse it rather than allocate.
with h5py.File(os.path.join(out, "hollow.h5"), "w") as f:
    f.create_dataset("examples/c0/pixels", shape=(1 << 16, 1 << 16), dtype=np.float32)
    f.create_dataset("examples/c0/label", data=np.zeros(4, dtype=np.int32))

# Clients whose images differ in shape cannot share a model.
with h5py.File(os.path.join(out, "ragged.h5"), "w") as f:
    for client, side in (("a", 28), ("b", 14)):
        f.create_dataset(f"examples/{client}/pixels", data=np.zeros((2, side, side), dtype=np.float32))
        f.create_dataset(f"examples/{client}/label", data=np.zeros(2, dtype=np.int32))

with h5py.File(os.path.join(out, "shakespeare.h5"), "w") as f:
    snippets = {
        "THE_TRAGEDY_OF_KING_LEAR_KENT": ["I think the king is but a man, as I am.", "Sir, I will."],
        "ROMEO_AND_JULIET_ROMEO": ["But soft, what light through yonder window breaks?"] * 3,
    }
    for client, lines in snippets.items():
        f.create_dataset(f"examples/{client}/snippets", data=np.array(lines, dtype=h5py.string_dtype()))
print(f"wrote TFF fixtures to {out}")
