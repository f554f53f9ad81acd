#!/usr/bin/env python3
"""Where a Keras inference call's host time goes on our device (issue 7's inference goal).

    python3 bench/call_path.py slope --device /GPU:0 [--ns 0,1,8,32] [--calls 500]
    TFWGPU_HOST_LOG=F python3 bench/call_path.py infer [--model cnn] [--calls 300]
    python3 bench/call_path.py analyze F [--per-call 7]

`slope`: a tf.function of n small unary ops (Relu / Abs alternating on 64 floats; run it with
`TFWGPU_FUSION=0` so that they stay n kernels) called back to back, one read at the end: us per
call for each n, and the slope per op. On /CPU:0 that is TensorFlow's own cost per graph op; on
/GPU:0 TensorFlow's cost for a PluggableDevice op plus the plugin's callback.

`infer`: the model's inference tf.function (bench/keras_models.py, `--device`, `--batch`) on a
batch already on the device, `--calls` calls back to back and one read (as bench/infer_interleaved.py times it), and
an identity tf.function on the same input; with `TFWGPU_HOST_LOG` set, marks `call_begin` /
`call_end` around the timed calls. Prints us per call and the CPU time per call of each of the
process's threads over the timed calls.

`analyze`: reads the host log written at that process's exit and splits the marked window
into calls by the compute callbacks (`--per-call` kernels each): per kernel the callback's span
and the time before its first dispatch, the gaps between callbacks (TensorFlow's executor), the
gap from one call's last callback to the next call's first (TensorFlow's per-call path),
submits and lock waits per call.
"""
import argparse
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def med(v):
    return statistics.median(v) if v else float("nan")


def timed(fn, calls, reps=7):
    out = fn()
    out.numpy()
    per = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(calls):
            out = fn()
        out.numpy()
        per.append((time.perf_counter() - t) / calls * 1e6)
    return med(per), per


def slope(a):
    import tensorflow as tf

    res = {}
    for n in [int(v) for v in a.ns.split(",")]:
        with tf.device(a.device):
            x = tf.random.uniform([64])

            @tf.function
            def f(v, n=n):
                y = v
                for i in range(n):
                    y = tf.nn.relu(y) if i % 2 == 0 else tf.math.abs(y)
                return y if n else tf.identity(v)

            for _ in range(50):
                f(x)
            res[n], per = timed(lambda: f(x), a.calls)
        print(f"slope {a.device} fusion={os.environ.get('TFWGPU_FUSION', '1')} n={n}: "
              f"{res[n]:.1f} us/call (reps {', '.join(f'{p:.1f}' for p in per)})", flush=True)
    ns = sorted(res)
    if len(ns) >= 2:
        lo, hi = ns[1] if len(ns) > 2 else ns[0], ns[-1]
        print(f"slope {a.device}: {(res[hi] - res[lo]) / (hi - lo):.2f} us per op (n {lo} -> {hi})")


def _runtime_stats():
    """The plugin's runtime counters (submits, dispatches, bind groups created...), or {}."""
    try:
        import tensorflow_wgpu

        d = json.loads(tensorflow_wgpu._plugin().tfwgpu_stats_json())
    except Exception:  # noqa: BLE001 - a bench without the package's counters
        return {}
    rt = d.get("runtime", {})
    return {k: v for k, v in rt.items() if isinstance(v, (int, float))}


def infer(a):
    import keras
    import tensorflow as tf

    import keras_models

    model, _, xd, fn = keras_models.prepare(tf, keras, a.model, a.device, a.batch)
    with tf.device(a.device):
        @tf.function
        def ident(v):
            return tf.identity(v)

        for _ in range(30):
            fn(xd)
            ident(xd)
        id_us, id_per = timed(lambda: ident(xd), a.calls, 3)
        print(f"identity: {id_us:.1f} us/call ({', '.join(f'{p:.1f}' for p in id_per)})")
        m_us, m_per = timed(lambda: fn(xd), a.calls, 3)
        print(f"{a.model} {a.device} batch {a.batch}: {m_us:.1f} us/call ({', '.join(f'{p:.1f}' for p in m_per)})")
        # Blocks of the model and of the identity alternating in this process (a slow process
        # shows whether only the model's calls are slow).
        alt = []
        for r in range(a.alternate):
            alt.append(("identity", timed(lambda: ident(xd), a.calls, 1)[0]))
            alt.append((a.model, timed(lambda: fn(xd), a.calls, 1)[0]))
        if alt:
            print("alternating us/call: " + ", ".join(f"{w} {v:.1f}" for w, v in alt))
        keras_models.host_log("reset")
        keras_models.host_log("mark", "call_begin")
        st0 = _runtime_stats()
        th0 = keras_models._threads(last_cpu=True)
        t = time.perf_counter()
        for _ in range(a.calls):
            out = fn(xd)
        out.numpy()
        dt = time.perf_counter() - t
        th1 = keras_models._threads(last_cpu=True)
        st1 = _runtime_stats()
        keras_models.host_log("mark", "call_end")
    print(f"{a.model} (marked window): {dt / a.calls * 1e6:.1f} us/call")
    rows = collections.defaultdict(float)
    for tid, (name, cpu, _) in th1.items():
        rows[name] += cpu - th0.get(tid, (name, 0.0, 0))[1]
    print("CPU us per call by thread name: " + ", ".join(
        f"{k} {v / a.calls * 1e6:.0f}" for k, v in sorted(rows.items(), key=lambda kv: -kv[1]) if v > 0))
    busy = {tid: v for tid, v in th1.items() if v[1] - th0.get(tid, (v[0], 0.0, 0))[1] > 0}
    print("last CPU of the busy threads: " + ", ".join(f"{n}@{c}" for n, _, c in busy.values()))
    if st0 and st1:
        print("runtime counters per call: " + ", ".join(
            f"{k} {(st1[k] - st0.get(k, 0)) / a.calls:.2f}" for k in sorted(st1)))


def analyze(a):
    d = json.load(open(a.file))
    kinds, labels, threads = d["kinds"], d["labels"], d["threads"]
    names = {i: (t[1] if isinstance(t, list) else str(t)) for i, t in enumerate(threads)}
    sp = sorted(((kinds[k], th, t0, t1, arg) for k, th, t0, t1, arg in d["spans"]), key=lambda s: s[2])
    marks = {labels[s[4]]: s[2] for s in sp if s[0] == "mark"}
    b, e = marks.get("call_begin", sp[0][2]), marks.get("call_end", sp[-1][3])
    w = [s for s in sp if b <= s[2] <= e and s[0] != "mark"]
    comp = [s for s in w if s[0] == "compute"]
    k = a.per_call
    calls = [comp[i:i + k] for i in range(0, len(comp) - k + 1, k)]
    print(f"window {(e - b) / 1e3:.0f} us, {len(comp)} callbacks, {len(calls)} calls of {k}; "
          f"{(e - b) / 1e3 / max(len(calls), 1):.1f} us per call")
    by = collections.defaultdict(list)
    for s in w:
        by[(s[0], names.get(s[1], s[1]))].append(s[3] - s[2])
    print("span kind (thread): count per call, us per call, median us")
    for (kind, th), v in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {kind:16s} {th:14s} {len(v) / max(len(calls), 1):6.2f} {sum(v) / 1e3 / max(len(calls), 1):9.1f} "
              f"{med(v) / 1e3:8.2f}")
    disp = [s for s in w if s[0] == "dispatch_lock"]
    print("per kernel (position in the call): label, callback us, before its first dispatch us, gap to next us")
    for j in range(k):
        cb = [c[j][3] - c[j][2] for c in calls]
        pre = []
        for c in calls:
            t0, t1, th = c[j][2], c[j][3], c[j][1]
            ds = [s[2] for s in disp if t0 <= s[2] <= t1 and s[1] == th][:1]
            if ds:
                pre.append(ds[0] - t0)
        gap = [c[j + 1][2] - c[j][3] for c in calls] if j + 1 < k else []
        print(f"  {j} {labels[calls[0][j][4]]:28s} {med(cb) / 1e3:7.2f} {med(pre) / 1e3:7.2f} "
              f"{med(gap) / 1e3 if gap else float('nan'):7.2f}")
    inner = [c[-1][3] - c[0][2] for c in calls]
    between = [calls[i + 1][0][2] - calls[i][-1][3] for i in range(len(calls) - 1)]
    print(f"first -> last callback of a call: median {med(inner) / 1e3:.1f} us; last callback -> next "
          f"call's first: median {med(between) / 1e3:.1f} us (p10 {sorted(between)[len(between) // 10] / 1e3:.1f}, "
          f"p90 {sorted(between)[9 * len(between) // 10] / 1e3:.1f})" if between else "")


def main(argv=None):
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("slope")
    s.add_argument("--device", default="/GPU:0")
    s.add_argument("--ns", default="0,1,8,32")
    s.add_argument("--calls", type=int, default=500)
    i = sub.add_parser("infer")
    i.add_argument("--model", default="cnn")
    i.add_argument("--calls", type=int, default=300)
    i.add_argument("--device", default="/GPU:0")
    i.add_argument("--batch", type=int, default=64)
    i.add_argument("--alternate", type=int, default=0, help="rounds of identity / model blocks")
    z = sub.add_parser("analyze")
    z.add_argument("file")
    z.add_argument("--per-call", type=int, default=7)
    a = p.parse_args(argv)
    {"slope": slope, "infer": infer, "analyze": analyze}[a.cmd](a)


if __name__ == "__main__":
    main()
