#!/usr/bin/python3
"""Reads a fax run log with h5py and checks the documented schema: names, shapes, types, values.

usage: check_run_log.py RUN.h5 ROUNDS COHORT CHECKPOINT_ROUNDS (comma-separated)
"""
import math
import sys

import h5py
import numpy as np


def fail(message):
    print(f"check_run_log: {message}", file=sys.stderr)
    sys.exit(1)


def expect(condition, message):
    if not condition:
        fail(message)


def main():
    path, rounds, cohort, checkpoint_rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    with h5py.File(path, "r") as f:
        config = f["config"][()].decode()
        expect("algorithm:" in config and "name: fedavg" in config, "/config lacks the algorithm section")
        expect(f"rounds: {rounds}" in config, f"/config does not say rounds: {rounds}")

        env = dict(f["env"].attrs)
        for key in ("fax_version", "torch_version", "host", "seed", "executors", "logical_shards"):
            expect(key in env, f"/env lacks {key}")
        expect(env["fax_version"].count(".") == 2, f"odd fax version {env['fax_version']}")

        metrics = f["metrics"]
        round_numbers = metrics["round"][()]
        expect(round_numbers.dtype == np.int64, f"/metrics/round is {round_numbers.dtype}")
        expect(list(round_numbers) == list(range(1, rounds + 1)), f"/metrics/round is {round_numbers}")
        for name in ("train/loss", "train/update_norm", "time/round_s", "eval/loss", "eval/accuracy"):
            data = metrics[name][()]
            expect(data.dtype == np.float64, f"/metrics/{name} is {data.dtype}")
            expect(data.shape == (rounds,), f"/metrics/{name} has shape {data.shape}")
        train_loss = metrics["train/loss"][()]
        expect(np.all(np.isfinite(train_loss)) and np.all(train_loss > 0), "train/loss is not finite and positive")
        accuracy = metrics["eval/accuracy"][()]
        evaluated = ~np.isnan(accuracy)
        eval_every = int(config.split("eval_every: ")[1].split()[0])
        expected_eval = [(r % eval_every == 0) or r == rounds for r in range(1, rounds + 1)]
        expect(list(evaluated) == expected_eval, "eval/accuracy is not NaN exactly off the evaluation rounds")
        expect(np.all((accuracy[evaluated] >= 0) & (accuracy[evaluated] <= 1)), "accuracy outside [0, 1]")
        expect(accuracy[evaluated][-1] > 0.3, f"final accuracy {accuracy[evaluated][-1]} is near chance")

        ids = f["clients/id"][()]
        expect(ids.shape == (rounds, cohort) and ids.dtype == np.int64, f"/clients/id is {ids.shape} {ids.dtype}")
        expect(all(len(set(row)) == cohort for row in ids), "a round's cohort repeats a client")
        client_loss = f["clients/train_loss"][()]
        expect(client_loss.shape == (rounds, cohort), f"/clients/train_loss has shape {client_loss.shape}")

        saved = sorted(int(k) for k in f["checkpoints"].keys())
        expect(saved == [int(r) for r in checkpoint_rounds.split(",")], f"checkpoints after rounds {saved}")
        last = f[f"checkpoints/{saved[-1]}"]
        w, b = last["params/w"][()], last["params/b"][()]
        expect(w.dtype == np.float32 and w.ndim == 2 and b.shape == (w.shape[1],), f"params/w {w.shape}, b {b.shape}")
        expect(last.attrs["leaves"].split("\n")[:2] == ["params/w", "params/b"], "leaf order attribute")
        expect(math.isfinite(float(np.abs(w).sum())) and np.abs(w).sum() > 0, "trained weights are zero or not finite")
    print(f"check_run_log: {path}: schema and values as documented ({rounds} rounds, cohort {cohort})")


main()
