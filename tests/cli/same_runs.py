"""same_runs.py A.h5 B.h5 ROUND: the two run logs have bit-identical metrics (all but the wall time
time/round_s; the simulated time is compared) and
bit-identical checkpoints after ROUND (parameters, optimizer state, client states)."""
import sys

import h5py


def leaves(group):
    names = []
    group.visit(lambda n: names.append(n) if isinstance(group[n], h5py.Dataset) else None)
    return sorted(names)


a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
metrics = [n for n in leaves(a["metrics"]) if n != "time/round_s"]
assert metrics == [n for n in leaves(b["metrics"]) if n != "time/round_s"], "different metrics"
for n in metrics:
    assert a["metrics"][n][()].tobytes() == b["metrics"][n][()].tobytes(), f"metric {n} differs"
checkpoint = f"checkpoints/{sys.argv[3]}"
state = leaves(a[checkpoint])
assert state == leaves(b[checkpoint]) and any(n.startswith("params/") for n in state), state
for n in state:
    assert a[checkpoint][n][()].tobytes() == b[checkpoint][n][()].tobytes(), f"{checkpoint}/{n} differs"
if "clients" in a:
    for n in leaves(a["clients"]):
        assert a["clients"][n][()].tobytes() == b["clients"][n][()].tobytes(), f"clients/{n} differs"
print(f"identical: {len(metrics)} metrics, {len(state)} checkpoint leaves")
