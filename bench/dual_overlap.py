"""Do two tfwgpu devices run their host work side by side? (issue 8)

One tf.function holds a chain of `--ops` small kernels (tanh(matmul(x, w)), 32x32 float32) on
/GPU:0 (`one`), or the same chain on /GPU:0 and an independent one on /GPU:1 (`two`: no data
crosses; TensorFlow's executor runs the two device partitions on its inter-op threads), or
(`two_copy`) the two chains with GPU:1's result copied to GPU:0 and added at the end (one
cross-device copy, as an all-reduce hop). Each call only records GPU work (no read back), so
its wall time is the host's: TensorFlow's executor plus the plugin's compute callbacks. If the
two devices' host work overlaps, `two` costs about what `one` does; if something serializes
the devices (a lock held across recording, a shared thread), `two` costs about twice `one`.
`*_sync` variants read the result back every call (a host sync per call, as Keras does per
step). Prints ms per call (median of `--reps` rounds of `--calls` calls) and the CPU ms per call
of each thread group (see bench/keras_models.py), and writes JSON.

    python bench/dual_overlap.py [--ops 200] [--calls 50] [--reps 5] [--json FILE]
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ops", type=int, default=200)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--n", type=int, default=32, help="matrix side")
    p.add_argument("--json")
    a = p.parse_args()
    import tensorflow as tf

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from keras_models import _group, _plugin_counters, _threads

    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if len(gpus) < 2:
        sys.exit("needs two GPUs (TFWGPU_VISIBLE_DEVICES=i,i opens one adapter twice)")
    rng = np.random.default_rng(0)
    init = rng.standard_normal((a.n, a.n)).astype(np.float32)
    wi = (rng.standard_normal((a.n, a.n)) / np.sqrt(a.n)).astype(np.float32)
    vals = {}
    for d in gpus[:2]:
        with tf.device(d):
            vals[d] = (tf.identity(tf.constant(init)), tf.identity(tf.constant(wi)))

    def chain(x, w):
        for _ in range(a.ops):
            x = tf.tanh(tf.matmul(x, w))
        return x

    g0, g1 = gpus[0], gpus[1]

    @tf.function
    def one(x0, w0):
        with tf.device(g0):
            return chain(x0, w0)

    @tf.function
    def two(x0, w0, x1, w1):
        with tf.device(g0):
            r0 = chain(x0, w0)
        with tf.device(g1):
            r1 = chain(x1, w1)
        return r0, r1

    @tf.function
    def two_copy(x0, w0, x1, w1):
        with tf.device(g0):
            r0 = chain(x0, w0)
        with tf.device(g1):
            r1 = chain(x1, w1)
        with tf.device(g0):
            return r0 + r1

    x0, w0 = vals[g0]
    x1, w1 = vals[g1]
    cases = {
        "one": (lambda: one(x0, w0), False),
        "two": (lambda: two(x0, w0, x1, w1), False),
        "two_copy": (lambda: two_copy(x0, w0, x1, w1), False),
        "one_sync": (lambda: one(x0, w0), True),
        "two_sync": (lambda: two(x0, w0, x1, w1), True),
        "two_copy_sync": (lambda: two_copy(x0, w0, x1, w1), True),
    }

    def sync(r):
        for t in r if isinstance(r, tuple) else (r,):
            t.numpy()

    # Warm-up: tracing, pipelines.
    for f, _ in cases.values():
        for _ in range(3):
            sync(f())
    res = {"gpus": gpus, "ops": a.ops, "n": a.n, "calls": a.calls, "cases": {}}
    main_tid = threading.main_thread().native_id
    rounds = {k: [] for k in cases}
    cpu = {k: {} for k in cases}
    stats = {k: {} for k in cases}
    for _ in range(a.reps):
        # Alternated: each round runs every case once.
        for k, (f, synced) in cases.items():
            c0, th0 = _plugin_counters(), _threads()
            t0 = time.perf_counter()
            for _ in range(a.calls):
                r = f()
                if synced:
                    sync(r)
            sync(r)
            rounds[k].append((time.perf_counter() - t0) / a.calls * 1e3)
            th1, c1 = _threads(), _plugin_counters()
            py = {t.native_id for t in threading.enumerate()}
            for tid, (name, sec) in th1.items():
                grp = _group(tid, name, main_tid, py)
                d = (sec - th0.get(tid, (name, 0.0))[1]) / a.calls * 1e3 / a.reps
                cpu[k][grp] = cpu[k].get(grp, 0.0) + d
            if c0 and c1:
                for key in c1:
                    v = (c1[key] - c0.get(key, 0)) / a.calls / a.reps
                    stats[k][key] = stats[k].get(key, 0.0) + v
    for k in cases:
        res["cases"][k] = {
            "ms_per_call_median": statistics.median(rounds[k]),
            "ms_per_call": rounds[k],
            "cpu_ms_per_call": {g: round(v, 3) for g, v in sorted(cpu[k].items(), key=lambda kv: -kv[1])},
            "per_call": {s: round(v, 3) for s, v in stats[k].items() if v},
        }
        c = res["cases"][k]
        print(f"{k:14s} {c['ms_per_call_median']:8.3f} ms/call  CPU ms/call: "
              + ", ".join(f"{g} {v:.2f}" for g, v in c["cpu_ms_per_call"].items() if v >= 0.01), flush=True)
    one_ms = res["cases"]["one"]["ms_per_call_median"]
    res["two_over_one"] = res["cases"]["two"]["ms_per_call_median"] / one_ms
    res["two_sync_over_one_sync"] = (res["cases"]["two_sync"]["ms_per_call_median"]
                                     / res["cases"]["one_sync"]["ms_per_call_median"])
    print(f"two / one: {res['two_over_one']:.2f}x; synced: {res['two_sync_over_one_sync']:.2f}x "
          "(1.0 = the devices' host work overlaps, 2.0 = serialized)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
