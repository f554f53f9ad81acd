#!/usr/bin/env python3
"""Summarises a host log (`TFWGPU_HOST_LOG=FILE`, written at process exit): where the plugin's and
runtime's host spans spend their wall time, per training step.

    python bench/hostlog.py FILE [--from MARK] [--to MARK] [--steps N] [--timeline K]

Spans between the first `--from` mark and the first `--to` mark after it (default: the marks
`train_begin` / `train_end` that `keras_models.py --host-budget` adds when the log is on; the
whole log without them). Steps: `--steps`, else the number of 1-byte host-to-device copies
(Keras fit uploads its `has_value()` flag once per step).

Prints: per span kind, calls and wall us per step (median and largest call); the host-to-device
copies by size, each split into the spans nested in it on its own thread (lock waits, encoder
creation, recording, submits...) and what other threads were doing while it waited for a lock
(their spans overlapping the wait, by kind); then, with `--timeline K`, every span of step K.
"""
import argparse
import bisect
import json
import statistics
import sys
from collections import defaultdict


def load(path):
    with open(path) as f:
        d = json.load(f)
    kinds = d["kinds"]
    labels = d["labels"]
    threads = d["threads"]
    spans = [(kinds[k], th, t0, t1, arg) for k, th, t0, t1, arg in d["spans"]]
    spans.sort(key=lambda s: s[2])
    return spans, labels, threads


def window(spans, labels, start, end):
    t_from, t_to = None, None
    for k, _, t0, _, arg in spans:
        if k != "mark":
            continue
        name = labels[arg] if arg < len(labels) else "?"
        if t_from is None and name == start:
            t_from = t0
        elif t_from is not None and t_to is None and name == end:
            t_to = t0
    if t_from is None:
        return spans, None
    t_to = t_to if t_to is not None else float("inf")
    return [s for s in spans if t_from <= s[2] and s[3] <= t_to], (t_from, t_to)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--from", dest="start", default="train_begin")
    p.add_argument("--to", dest="end", default="train_end")
    p.add_argument("--steps", type=int)
    p.add_argument("--timeline", type=int, metavar="K", help="print every span of step K")
    p.add_argument("--json", help="write the summary as JSON")
    a = p.parse_args()
    spans, labels, threads = load(a.file)
    spans, win = window(spans, labels, a.start, a.end)
    flags = [s for s in spans if s[0] == "htod" and s[4] == 1]
    steps = a.steps or len(flags) or 1
    tname = lambda th: (threads[th][1] if th < len(threads) else "?")
    out = {"steps": steps, "window_ms": (win[1] - win[0]) / 1e6 if win and win[1] != float("inf") else None}
    print(f"host log {a.file}: {len(spans)} spans, {steps} steps"
          + (f", {out['window_ms'] / steps:.3f} ms/step" if out["window_ms"] else ""))

    # Per kind.
    by_kind = defaultdict(list)
    for k, th, t0, t1, arg in spans:
        by_kind[k].append(t1 - t0)
    print(f"{'kind':22s} {'calls/step':>10s} {'us/step':>9s} {'median us':>9s} {'max us':>8s}")
    out["kinds"] = {}
    for k, v in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        if k == "mark":
            continue
        row = {"calls_per_step": len(v) / steps, "us_per_step": sum(v) / 1e3 / steps,
               "median_us": statistics.median(v) / 1e3, "max_us": max(v) / 1e3}
        out["kinds"][k] = row
        print(f"{k:22s} {row['calls_per_step']:10.2f} {row['us_per_step']:9.1f} "
              f"{row['median_us']:9.1f} {row['max_us']:8.1f}")

    # Spans overlapping an interval: short ones found by their start, long ones scanned.
    LONG = 1_000_000
    short = [s for s in spans if s[3] - s[2] <= LONG and s[0] != "mark"]
    starts = [s[2] for s in short]
    longs = [s for s in spans if s[3] - s[2] > LONG]

    def overlapping(u0, u1):
        i = bisect.bisect_left(starts, u0 - LONG)
        j = bisect.bisect_right(starts, u1)
        for s in short[i:j]:
            if s[3] > u0 and s[2] < u1:
                yield s
        for s in longs:
            if s[3] > u0 and s[2] < u1:
                yield s

    # Host-to-device copies: nested spans on the same thread.
    by_thread = defaultdict(list)
    for s in spans:
        by_thread[s[1]].append(s)
    lock_kinds = ("arena_lock", "direct_lock", "dispatch_lock")
    classes = defaultdict(lambda: {"n": 0, "wall": 0, "parts": defaultdict(int), "waits_on": defaultdict(int),
                                   "overlap": defaultdict(int)})
    for k, th, t0, t1, arg in spans:
        if k != "htod":
            continue
        size = arg
        cls = "1-3 B" if size < 4 else ("<=64 B" if size <= 64 else ("<64 KiB" if size < 65536 else ">=64 KiB"))
        c = classes[cls]
        c["n"] += 1
        c["wall"] += t1 - t0
        mine = by_thread[th]
        for k2, _, u0, u1, a2 in mine[bisect.bisect_left(mine, t0, key=lambda s: s[2]):]:
            if u0 > t1:
                break
            if k2 == "htod" or u1 > t1:
                continue
            c["parts"][k2] += u1 - u0
            if k2 in lock_kinds and u1 - u0 > 2000:
                for k3, th3, v0, v1, _ in overlapping(u0, u1):
                    if th3 == th:
                        continue
                    c["waits_on"][f"{k3}@{tname(th3)}"] += min(v1, u1) - max(v0, u0)
        for k3, th3, v0, v1, _ in overlapping(t0, t1):
            if th3 == th or k3 in ("compute", "host_compute"):
                continue
            c["overlap"][k3] += min(v1, t1) - max(v0, t0)
    out["htod"] = {}
    for cls, c in sorted(classes.items()):
        n = c["n"]
        print(f"\nhtod {cls}: {n / steps:.2f}/step, {c['wall'] / 1e3 / n:.1f} us each "
              f"({c['wall'] / 1e3 / steps:.1f} us/step); nested spans, us each:")
        parts = {k: v / 1e3 / n for k, v in sorted(c["parts"].items(), key=lambda kv: -kv[1])}
        print("   " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()))
        if c["waits_on"]:
            w = sorted(c["waits_on"].items(), key=lambda kv: -kv[1])[:8]
            print("   while it waited for a lock, other threads ran (us each): "
                  + ", ".join(f"{k} {v / 1e3 / n:.1f}" for k, v in w))
        ov = sorted(c["overlap"].items(), key=lambda kv: -kv[1])[:8]
        print("   other threads during it (us each): " + ", ".join(f"{k} {v / 1e3 / n:.1f}" for k, v in ov))
        out["htod"][cls] = {"per_step": n / steps, "us_each": c["wall"] / 1e3 / n, "parts_us_each": parts,
                            "waits_on_us_each": {k: v / 1e3 / n for k, v in c["waits_on"].items()},
                            "overlap_us_each": {k: v / 1e3 / n for k, v in c["overlap"].items()}}

    # Submits: by thread.
    subs = defaultdict(lambda: [0, 0])
    for k, th, t0, t1, arg in spans:
        if k == "submit":
            subs[tname(th)][0] += 1
            subs[tname(th)][1] += t1 - t0
    if subs:
        print("\nsubmits by thread: " + ", ".join(f"{t} {n / steps:.2f}/step {ns / 1e3 / steps:.1f} us/step"
                                                  for t, (n, ns) in sorted(subs.items(), key=lambda kv: -kv[1][1])))

    if a.timeline is not None and flags:
        k = min(a.timeline, len(flags) - 1)
        t_lo = flags[k - 1][3] if k > 0 else flags[k][2] - 5_000_000
        t_hi = flags[k][3]
        print(f"\ntimeline of step {k} (from the previous step's flag upload to this one's), us from its start:")
        for s in spans:
            if t_lo <= s[2] <= t_hi:
                kk, th, t0, t1, arg = s
                lab = labels[arg] if kk in ("compute", "host_compute", "mark") and arg < len(labels) else arg
                print(f"  {(t0 - t_lo) / 1e3:9.1f} {(t1 - t0) / 1e3:8.1f}  {tname(th)[:14]:14s} {kk:20s} {lab}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
