#!/usr/bin/env python3
"""Kernel calls and dispatches per traced step of tfwgpu traces (TFWGPU_TRACE, as
bench/keras_models.py --trace writes them; plain or .gz): the mean over the intervals opened
by `train_step` and `infer_step` marks (each closed by the next mark), and the ops of the first
training step.

    python3 bench/trace_counts.py bench/traces/mlp.trace.gz bench/data/2026-11-30-fusion-off-mlp.trace.gz
"""
import collections, gzip, json, sys

def load(p):
    op = gzip.open if p.endswith(".gz") else open
    with op(p, "rt") as f:
        return [json.loads(l) for l in f]

def steps(evs):
    out = {"train": [], "infer": []}
    cur = None
    for e in evs:
        if e["ev"] == "mark":
            l = e["label"]
            if cur is not None:
                out[cur[0]].append(cur[1])
                cur = None
            if l == "train_step":
                cur = ("train", [])
            elif l == "infer_step":
                cur = ("infer", [])
        elif e["ev"] == "kernel" and cur is not None:
            cur[1].append(e)
    return out

for p in sys.argv[1:]:
    s = steps(load(p))
    for k, v in s.items():
        if not v:
            continue
        calls = sum(len(x) for x in v) / len(v)
        disp = sum(sum(e.get("dispatches", 0) for e in x) for x in v) / len(v)
        print(f"{p}: {k}: {len(v)} steps, {calls:.1f} kernel calls/step, {disp:.1f} dispatches/step")
        if k == "train":
            c = collections.Counter(e["op"] for e in v[0])
            print("   ", ", ".join(f"{o} {n}" for o, n in c.most_common(14)))
