"""Where each device's thread spent a step of `tfwgpu-bench replay TRACE --per-device
--timeline FILE`: per step label, medians over its steps of the time each thread spent
recording kernels, waiting for copies from the other device to land, in host syncs (reads
back, synchronizations), in uploads, and at the step's closing mark (draining its GPU and
waiting for the other device); then, for the median step of `--label`, the sequence of every
non-kernel event with its times into the step.

    python bench/replay_timeline.py TIMELINE [--label 2gpu]
"""
import argparse
import json
import statistics
from collections import defaultdict


def main():
    p = argparse.ArgumentParser()
    p.add_argument("timeline")
    p.add_argument("--label", default="2gpu")
    a = p.parse_args()
    spans, marks = [], []
    for line in open(a.timeline):
        v = json.loads(line)
        (marks if "mark" in v else spans).append(v)
    bounds = [(m["mark"], m["t_us"], n["t_us"]) for m, n in zip(marks, marks[1:])]
    by_label = defaultdict(list)
    for label, t0, t1 in bounds:
        per_dev = defaultdict(lambda: defaultdict(float))
        seq = []
        for s in spans:
            # The span of the mark that closes the interval belongs to it (drain + barrier).
            if not (t0 <= s["start_us"] < t1) and not (s["ev"] == "mark" and abs(s["end_us"] - t1) < 50 and s["start_us"] < t1):
                continue
            d = per_dev[s["dev"]]
            d["land_wait"] += s["landed_us"] - s["start_us"]
            work = s["end_us"] - s["landed_us"]
            key = {"kernel": "kernels", "d2h": "host_syncs", "sync": "host_syncs", "h2d": "uploads",
                   "mark": "closing_mark", "d2d": "copies_issued"}.get(s["ev"], "other")
            d[key] += work
            if s["ev"] != "kernel":
                seq.append(s)
        by_label[label].append((t1 - t0, per_dev, seq, t0))
    keys = ["kernels", "land_wait", "host_syncs", "uploads", "copies_issued", "closing_mark", "other"]
    for label, steps in by_label.items():
        if len(steps) < 3:
            continue
        print(f"{label}: {len(steps)} steps, median {statistics.median(s[0] for s in steps) / 1e3:.3f} ms")
        devs = sorted({d for s in steps for d in s[1]})
        for d in devs:
            med = {k: statistics.median(s[1][d][k] for s in steps) / 1e3 for k in keys}
            print(f"  dev {d}: " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()) + " (ms, medians)")
    steps = sorted(by_label.get(a.label, []), key=lambda s: s[0])
    if steps:
        wall, _, seq, t0 = steps[len(steps) // 2]
        print(f"median {a.label} step ({wall / 1e3:.3f} ms): non-kernel events, ms into the step "
              "(start, copies landed, end)")
        for s in sorted(seq, key=lambda s: s["start_us"]):
            extra = f" {s.get('size', '')}" + (f" -> dev {s['to_dev']}" if s.get("to_dev") is not None else "")
            print(f"  dev {s['dev']} {s['ev']:<6}{extra:<18} {(s['start_us'] - t0) / 1e3:8.3f} "
                  f"{(s['landed_us'] - t0) / 1e3:8.3f} {(s['end_us'] - t0) / 1e3:8.3f}")


if __name__ == "__main__":
    main()
