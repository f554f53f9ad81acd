"""Where the host time of a traced program goes, per device and per thread: reads a
TFWGPU_TRACE file (format version 1 with "t_us" and "thread") and, for the intervals between
step marks (tensorflow_wgpu.trace_mark; bench/mirrored.py writes them), prints per step label:
the median step time, and per device the kernel calls, the host time inside the plugin's
kernel calls (host_us: shape inference + recording), the threads that issued them, how long the
device's calls spanned within the step, and how much the devices' spans overlapped.

    python bench/trace_threads.py TRACE [--json FILE]
"""
import argparse
import gzip
import json
import statistics
from collections import defaultdict


def events(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        for line in f:
            e = json.loads(line)
            if e.get("ev") != "header":
                yield e


def steps(evs):
    """(label, [events]) for every interval that a mark opens and the next mark closes."""
    cur, label = None, None
    for e in evs:
        if e["ev"] == "mark":
            if cur is not None:
                yield label, cur
            cur, label = [], e["label"]
        elif cur is not None:
            cur.append(e)


def analyse(step_events):
    t = [e["t_us"] for e in step_events]
    per_dev = defaultdict(lambda: {"calls": 0, "host_us": 0.0, "threads": set(), "first": None, "last": None})
    syncs = defaultdict(int)
    for e in step_events:
        d = e.get("dev", -1)
        if e["ev"] == "kernel":
            s = per_dev[d]
            s["calls"] += 1
            s["host_us"] += e.get("host_us", 0.0)
            s["threads"].add(e["thread"])
            start = e["t_us"] - e.get("host_us", 0.0)
            s["first"] = start if s["first"] is None else min(s["first"], start)
            s["last"] = e["t_us"] if s["last"] is None else max(s["last"], e["t_us"])
        elif e["ev"] in ("d2h", "sync"):
            syncs[d] += 1
    spans = {d: (s["first"], s["last"]) for d, s in per_dev.items() if s["first"] is not None}
    overlap = 0.0
    if len(spans) == 2:
        (a0, a1), (b0, b1) = spans.values()
        overlap = max(0.0, min(a1, b1) - max(a0, b0))
    return {
        "wall_us": (max(t) - min(t)) if t else 0.0,
        "devices": {
            d: {
                "calls": s["calls"],
                "host_us": s["host_us"],
                "threads": sorted(s["threads"]),
                "span_us": (s["last"] - s["first"]) if s["first"] is not None else 0.0,
                "host_syncs": syncs[d],
            }
            for d, s in sorted(per_dev.items())
        },
        "overlap_us": overlap,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--json")
    a = p.parse_args()
    by_label = defaultdict(list)
    for label, ev in steps(events(a.trace)):
        if label != "end":  # "end" closes the last step; what follows is not a step
            by_label[label].append(analyse(ev))
    out = {}
    for label, rows in by_label.items():
        rows = rows[1:] if len(rows) > 2 else rows  # the first step after a mark warms up
        med = lambda xs: statistics.median(xs) if xs else 0.0  # noqa: E731
        devs = sorted({d for r in rows for d in r["devices"]})
        summary = {
            "steps": len(rows),
            "wall_ms": med([r["wall_us"] for r in rows]) / 1e3,
            "overlap_ms": med([r["overlap_us"] for r in rows]) / 1e3,
            "devices": {},
        }
        print(f"{label}: {len(rows)} steps, median step {summary['wall_ms']:.2f} ms, "
              f"device spans overlap {summary['overlap_ms']:.2f} ms")
        for d in devs:
            rs = [r["devices"][d] for r in rows if d in r["devices"]]
            threads = sorted({t for r in rs for t in r["threads"]})
            s = {
                "calls": med([r["calls"] for r in rs]),
                "host_ms": med([r["host_us"] for r in rs]) / 1e3,
                "span_ms": med([r["span_us"] for r in rs]) / 1e3,
                "host_syncs": med([r["host_syncs"] for r in rs]),
                "threads": threads,
                "threads_per_step": med([len(r["threads"]) for r in rs]),
            }
            summary["devices"][str(d)] = s
            print(f"  dev {d}: {s['calls']:.0f} kernel calls, {s['host_ms']:.2f} ms inside the plugin's "
                  f"calls, calls span {s['span_ms']:.2f} ms, {s['host_syncs']:.0f} host syncs, "
                  f"{len(threads)} threads ({s['threads_per_step']:.0f} per step)")
        out[label] = summary
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
