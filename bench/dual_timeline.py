"""Where a traced MirroredStrategy step's host time goes, phase by phase (issue 8).

Reads a TFWGPU_TRACE of bench/mirrored.py (step marks `1gpu` / `2gpu`) and, for each step
label, prints medians over the steps of:
- the step's wall time (mark to mark);
- per device: kernel calls, host time inside the plugin's compute callbacks (host_us), the
  span from the step's start to its first and last kernel call;
- the time both devices were inside a compute callback at once, and the time only one was
  (if the two replicas' host work overlapped perfectly, "both" ~ each device's callback time);
- the threads that issued kernels: how many served one device only and how many served both
  (a thread that records for both devices serializes them);
- phases of the step on the host clock: `fwd/bwd` = step start to the first cross-device copy;
  `all-reduce` = first copy issued to the last copy finished (`copied` events: the copier
  thread's write on the destination); `after` = the last copy to the step's last kernel call;
  `tail` = last kernel call to the next step's mark (Keras's end of step: reading the loss and
  the `has_value` flag, i.e. waiting for the GPUs, and its Python loop);
- host syncs (d2h reads and syncs) per device and where they fall.

    python bench/dual_timeline.py TRACE [--json FILE] [--steps-shown 1]
"""
import argparse
import gzip
import json
import statistics
from collections import Counter, defaultdict


def events(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        for line in f:
            e = json.loads(line)
            if e.get("ev") != "header":
                yield e


def steps(evs):
    cur, label, t0 = None, None, None
    for e in evs:
        if e["ev"] == "mark":
            if cur is not None:
                yield label, t0, e["t_us"], cur
            cur, label, t0 = [], e["label"], e["t_us"]
        elif cur is not None:
            cur.append(e)


def union(iv):
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def length(iv):
    return sum(b - a for a, b in iv)


def intersect(x, y):
    i = j = 0
    out = []
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append([a, b])
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def analyse(t0, t1, ev):
    kern = [e for e in ev if e["ev"] == "kernel"]
    devs = sorted({e["dev"] for e in kern})
    iv = {d: union([(e["t_us"] - e.get("host_us", 0.0), e["t_us"]) for e in kern if e["dev"] == d]) for d in devs}
    r = {"wall_us": t1 - t0, "devices": {}}
    for d in devs:
        ks = [e for e in kern if e["dev"] == d]
        r["devices"][d] = {
            "calls": len(ks),
            "host_us": sum(e.get("host_us", 0.0) for e in ks),
            "first_us": min(e["t_us"] - e.get("host_us", 0.0) for e in ks) - t0,
            "last_us": max(e["t_us"] for e in ks) - t0,
            "syncs": sum(1 for e in ev if e["ev"] in ("d2h", "sync") and e.get("dev") == d),
            # Callbacks far above the typical one (a lock wait, a submit done inline, a read
            # of a data-dependent shape): how many and their time above 50 us each.
            "slow_calls": sum(1 for e in ks if e.get("host_us", 0.0) > 50.0),
            "slow_excess_us": sum(e.get("host_us", 0.0) - 50.0 for e in ks if e.get("host_us", 0.0) > 50.0),
            "median_call_us": statistics.median(e.get("host_us", 0.0) for e in ks),
        }
    if len(devs) == 2:
        both = length(intersect(iv[devs[0]], iv[devs[1]]))
        r["both_in_callback_us"] = both
        r["either_in_callback_us"] = length(union(iv[devs[0]] + iv[devs[1]]))
    threads = defaultdict(Counter)
    for e in kern:
        threads[e["thread"]][e["dev"]] += 1
    r["threads_one_device"] = sum(1 for c in threads.values() if len(c) == 1)
    r["threads_both_devices"] = sum(1 for c in threads.values() if len(c) > 1)
    r["kernels_on_shared_threads"] = sum(sum(c.values()) for c in threads.values() if len(c) > 1)
    # The all-reduce's copies: the gradient pack (hundreds of KB); small copies between the
    # devices (scalars, the step counter) are counted, not phases.
    cross_all = [e for e in ev if e["ev"] == "d2d" and e.get("to_dev") is not None]
    cross = [e for e in cross_all if e["size"] >= 65536]
    copied = [e for e in ev if e["ev"] == "copied" and e["size"] >= 65536]
    r["small_cross_copies"] = len(cross_all) - len(cross)
    last_k = max((e["t_us"] for e in kern), default=t0)
    if cross:
        c0 = min(e["t_us"] for e in cross)
        c1 = max([e["t_us"] for e in copied] or [e["t_us"] for e in cross])
        r["phases_us"] = {"fwd/bwd": c0 - t0, "all-reduce": c1 - c0, "after": last_k - c1, "tail": t1 - last_k}
        r["cross_copies"] = len(cross)
        r["copy_issue_to_done_us"] = [round(b["t_us"] - a["t_us"]) for a, b in zip(cross, copied)]
    else:
        r["phases_us"] = {"kernels": last_k - t0, "tail": t1 - last_k}
    r["syncs"] = [(e["ev"], e.get("dev"), round(e["t_us"] - t0), e.get("what", e.get("size")))
                  for e in ev if e["ev"] in ("d2h", "sync")]
    return r


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--json")
    p.add_argument("--steps-shown", type=int, default=1)
    a = p.parse_args()
    by = defaultdict(list)
    for label, t0, t1, ev in steps(events(a.trace)):
        if label != "end":
            by[label].append(analyse(t0, t1, ev))
    out = {}
    med = statistics.median
    for label, rows in by.items():
        rows = rows[1:-1] if len(rows) > 3 else rows
        devs = sorted({d for r in rows for d in r["devices"]})
        s = {"steps": len(rows), "wall_ms": med(r["wall_us"] for r in rows) / 1e3, "devices": {}}
        for d in devs:
            rs = [r["devices"][d] for r in rows]
            s["devices"][d] = {k: med(x[k] for x in rs) for k in rs[0]}
        for k in ("both_in_callback_us", "either_in_callback_us", "threads_one_device",
                  "threads_both_devices", "kernels_on_shared_threads", "cross_copies",
                  "small_cross_copies"):
            if k in rows[0]:
                s[k] = med(r[k] for r in rows)
        s["phases_ms"] = {k: med(r["phases_us"][k] for r in rows) / 1e3 for k in rows[0]["phases_us"]}
        out[label] = s
        print(f"{label}: {s['steps']} steps, median {s['wall_ms']:.3f} ms; phases (ms) "
              + ", ".join(f"{k} {v:.3f}" for k, v in s["phases_ms"].items()))
        for d, x in s["devices"].items():
            print(f"  dev {d}: {x['calls']:.0f} calls, {x['host_us'] / 1e3:.3f} ms in callbacks (median "
                  f"{x['median_call_us']:.1f} us; {x['slow_calls']:.0f} over 50 us, {x['slow_excess_us'] / 1e3:.3f} ms "
                  f"above it), first {x['first_us'] / 1e3:.3f} last {x['last_us'] / 1e3:.3f} ms, {x['syncs']:.0f} syncs")
        if "both_in_callback_us" in s:
            print(f"  in a callback: both devices {s['both_in_callback_us'] / 1e3:.3f} ms, either "
                  f"{s['either_in_callback_us'] / 1e3:.3f} ms; threads: {s['threads_one_device']:.0f} "
                  f"one device, {s['threads_both_devices']:.0f} both ({s['kernels_on_shared_threads']:.0f} kernels)")
        if "cross_copies" in s:
            print(f"  copies between the devices: {s['cross_copies']:.0f} of >= 64 KiB, "
                  f"{s['small_cross_copies']:.0f} small")
        for r in rows[: a.steps_shown]:
            if "copy_issue_to_done_us" in r:
                print("  large copies of one step, issue to copier done (us):", r["copy_issue_to_done_us"])
            print("  syncs of one step (kind, dev, us from start, size/what):", r["syncs"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
