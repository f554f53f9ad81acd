#!/usr/bin/env python3
"""The critical path of a Keras training step, from a host log (`TFWGPU_HOST_LOG=FILE` around
`bench/keras_models.py --host-budget 1`, as `bench/hostlog.py` reads it).

    python bench/hostlog_path.py FILE [--json OUT] [--per-op]

A Keras fit step on our device, as the host log shows it (one thread at a time holds the
step): the tf.function ends (its last host-to-device copy: the 1-byte `has_value()` flag);
Python's thread syncs and reads the flag (answered by the host mirror), runs Keras's loop
and converts the loss to a float (`pythonify_logs`: a sync and a 4-byte device read, which
waits for the GPU to finish everything recorded), then calls the next step's tf.function,
whose executor threads run the kernels' compute callbacks. Per step, between consecutive
flag uploads, the median of each segment:

- fn_end->hv_sync: from the flag's upload to the `has_value()` sync (TensorFlow returning
  from the function, the eager OptionalHasValue);
- hv_sync+read: that sync and the flag's read;
- py->loss_sync: Python from the flag's read to the loss's sync (Keras's loop);
- loss_sync, loss_read: the loss's sync and its 4-byte read (the wait for the GPU);
- py->first_op: from the loss read to the first compute callback or upload of the next step
  on an executor thread (Keras's loop, the tf.function call, the executor's start);
- ops: first to last callback / upload of the step on the executor threads;
- last_op->fn_end: from the last one to the next flag upload (TensorFlow's own nodes after
  the last kernel: variable assignments, the function's outputs).

Without the flag's upload (eager ops run as kernels, `TFWGPU_EAGER_OPS_DIRECT=1`, opt-in:
the flag stays on the host), steps run from one loss sync to the next: loss_sync, loss_read,
py->first_op, ops and last_op->loss_sync (the function's end, `has_value()`, `get_value()` and
Keras's loop). Logs with the flag give last_op->loss_sync too (last_op->fn_end + fn_end->hv_sync +
hv_sync+read + py->loss_sync), for comparing the two.

Then the loss reads split by how long before them the last batch was submitted: a read soon
after a submit waits for the GPU to run that batch (the GPU's tail on the critical path).
"""
import argparse
import json
import statistics as st


def load(path):
    with open(path) as f:
        d = json.load(f)
    kinds, labels, threads = d["kinds"], d["labels"], d["threads"]
    spans = sorted(((kinds[k], th, t0, t1, a) for k, th, t0, t1, a in d["spans"]), key=lambda s: s[2])
    marks = {labels[s[4]]: s[2] for s in spans if s[0] == "mark" and s[4] < len(labels)}
    if "train_begin" in marks and "train_end" in marks:
        spans = [s for s in spans if marks["train_begin"] <= s[2] <= marks["train_end"]]
    # Python's main thread: the one that syncs (TensorFlow's Device::Sync before each eager
    # read: the has_value() flag and the loss).
    counts = {}
    for s in spans:
        if s[0] == "sync":
            counts[s[1]] = counts.get(s[1], 0) + 1
    main = max(counts, key=counts.get)
    return spans, main


def segments(spans, main):
    flags = [s for s in spans if s[0] == "htod" and s[4] == 1]
    rows = []
    for k in range(5, len(flags) - 2):
        a, b = flags[k][2], flags[k + 1][2]
        ss = [s for s in spans if a <= s[2] < b]
        syncs = [s for s in ss if s[1] == main and s[0] == "sync"]
        reads = [s for s in ss if s[1] == main and s[0] == "dtoh"]
        ops = [s for s in ss if s[0] in ("compute", "htod", "host_compute") and s[1] != main and s[4] != 1]
        if len(syncs) < 2 or len(reads) < 2 or not ops:
            continue
        last = max(o[3] for o in ops)
        rows.append({
            "fn_end->hv_sync": syncs[0][2] - a,
            "hv_sync+read": reads[0][3] - syncs[0][2],
            "py->loss_sync": syncs[1][2] - reads[0][3],
            "loss_sync": syncs[1][3] - syncs[1][2],
            "loss_read": reads[1][3] - reads[1][2],
            "py->first_op": ops[0][2] - reads[1][3],
            "ops": last - ops[0][2],
            "last_op->fn_end": b - last,
            "step": b - a,
            "callbacks (sum)": sum(o[3] - o[2] for o in ops),
            # The last call to the loss's sync, across the step boundary (the flag's upload):
            # comparable with the same segment of a log without flag uploads.
            "last_op->loss_sync": (b - last) + (syncs[1][2] - a),
        })
    if not rows:
        rows = segments_direct(spans, main)
    return rows


def step_groups(spans, main):
    """Without flag uploads (eager ops run as kernels, `TFWGPU_EAGER_OPS_DIRECT=1`: the
    `has_value()` flag stays on the host): the main thread's syncs grouped by step, a group
    starting at a sync with executor-thread work since the previous sync."""
    groups, seen_ops = [], True
    for s in spans:
        if s[1] != main and s[0] in ("compute", "htod", "host_compute"):
            seen_ops = True
        elif s[1] == main and s[0] == "sync":
            if seen_ops:
                groups.append([])
                seen_ops = False
            groups[-1].append(s)
    return groups


def segments_direct(spans, main):
    """Steps between the first syncs of consecutive step groups (the loss's sync): the loss's
    sync and read, Python to the next step's first kernel call, the calls, and from the last
    call to the next loss sync (the function's end, `has_value()`, `get_value()`, Keras's loop:
    what the flag-delimited segments split further)."""
    groups = step_groups(spans, main)
    rows = []
    for k in range(5, len(groups) - 2):
        a, b = groups[k][0][2], groups[k + 1][0][2]
        ss = [s for s in spans if a <= s[2] < b]
        reads = [s for s in ss if s[1] == main and s[0] == "dtoh"]
        ops = [s for s in ss if s[0] in ("compute", "htod", "host_compute") and s[1] != main]
        if not reads or not ops:
            continue
        last = max(o[3] for o in ops)
        last_read = max(r[3] for r in reads if r[3] <= ops[0][2]) if any(r[3] <= ops[0][2] for r in reads) else reads[0][3]
        rows.append({
            "loss_sync": groups[k][0][3] - groups[k][0][2],
            "loss_read": reads[0][3] - reads[0][2],
            "py->first_op": ops[0][2] - last_read,
            "ops": last - ops[0][2],
            "last_op->loss_sync": b - last,
            "step": b - a,
            "callbacks (sum)": sum(o[3] - o[2] for o in ops),
        })
    return rows


def reads_by_last_submit(spans, main):
    reads = [s for s in spans if s[0] == "dtoh" and s[1] == main and s[4] == 4]
    subs = [s for s in spans if s[0] == "submit"]
    out = []
    for r in reads:
        before = [s for s in subs if s[3] <= r[2]]
        if before:
            out.append(((r[2] - before[-1][3]) / 1e3, (r[3] - r[2]) / 1e3))
    return out


def per_op(spans, labels, steps):
    """Each op's compute callbacks (and the uploads on executor threads): calls per step, the
    median call and the total per step, in us, heaviest first."""
    calls = {}
    for s in spans:
        if s[0] in ("compute", "host_compute"):
            name = labels[s[4]] if s[4] < len(labels) else str(s[4])
        elif s[0] == "htod":
            name = "(uploads)"
        else:
            continue
        calls.setdefault(name, []).append((s[3] - s[2]) / 1e3)
    rows = [(k, len(v) / steps, st.median(v), sum(v) / steps) for k, v in calls.items()]
    return sorted(rows, key=lambda r: -r[3])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--json")
    p.add_argument("--per-op", action="store_true",
                   help="also each op's callbacks: calls per step, median call, us per step")
    a = p.parse_args()
    spans, main_th = load(a.file)
    rows = segments(spans, main_th)
    res = {"steps": len(rows), "segments_us": {}, "reads": []}
    print(f"{a.file}: {len(rows)} steps; per step, us: median (p25-p75)")
    for key in rows[0] if rows else []:
        v = [r[key] / 1e3 for r in rows]
        q = st.quantiles(v, n=4)
        res["segments_us"][key] = {"median": st.median(v), "p25": q[0], "p75": q[2]}
        print(f"  {key:18s} {st.median(v):8.1f}  ({q[0]:.1f}-{q[2]:.1f})")
    rd = reads_by_last_submit(spans, main_th)
    print("  loss reads by the time since the last submit before them:")
    for lo, hi in ((0, 200), (200, 400), (400, 700), (700, 1e9)):
        b = [r for r in rd if lo <= r[0] < hi]
        if b:
            row = {"from_us": lo, "to_us": hi, "reads": len(b), "median_read_us": st.median(r[1] for r in b)}
            res["reads"].append(row)
            print(f"    {lo:>4}-{hi if hi < 1e9 else 'inf':>4} us: {len(b):4d} reads, median {row['median_read_us']:.1f} us")
    if a.per_op:
        with open(a.file) as f:
            labels = json.load(f)["labels"]
        steps = sum(1 for s in spans if s[0] == "htod" and s[4] == 1)
        if steps < 8:
            steps = max(1, len(step_groups(spans, main_th)))
        res["per_op"] = {}
        print(f"  {'op (callbacks)':36s} {'calls/step':>10s} {'median us':>10s} {'us/step':>9s}")
        for name, n, med, tot in per_op(spans, labels, steps):
            res["per_op"][name] = {"calls_per_step": n, "median_us": med, "us_per_step": tot}
            print(f"  {name[:36]:36s} {n:10.2f} {med:10.1f} {tot:9.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
