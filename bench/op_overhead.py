#!/usr/bin/env python3
"""Host overhead per op (issue 7): the same tiny ops on tfwgpu's /GPU:0 and on TensorFlow's
/CPU:0, eagerly and inside a tf.function, on tensors so small (4 floats) that the time is the
framework's and the plugin's, not the kernel's.

    python bench/op_overhead.py [--ops 2000] [--reps 5] [--json FILE]

Eager: a chain of N `x = x * a + b` steps (2 ops each, each op's output feeds the next, no host
read until the end). tf.function: the same chain traced into one graph of 2N nodes. Reported:
microseconds per op (median of reps; the end-of-chain read is included once per rep). On a
software adapter (lavapipe) the GPU kernels run on the same CPU, so the GPU column also holds
lavapipe's own dispatch cost; on a hardware GPU it is the host-side work alone while the GPU
keeps up.
"""
import argparse
import json
import statistics
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, default=2000, help="ops per chain (even)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json")
    a = p.parse_args(argv)
    import tensorflow as tf

    steps = max(1, a.ops // 2)
    devices = ["/CPU:0"] + (["/GPU:0"] if tf.config.list_logical_devices("GPU") else [])
    out = {"ops_per_chain": 2 * steps, "results": []}
    for dev in devices:
        with tf.device(dev):
            x0 = tf.constant([1.0, 2.0, 3.0, 4.0])
            m = tf.constant([0.5, 0.5, 0.5, 0.5])
            b = tf.constant([1.0, 1.0, 1.0, 1.0])

            def chain(x):
                for _ in range(steps):
                    x = x * m + b
                return x

            graph = tf.function(chain)
            for mode, fn in (("eager", chain), ("tf.function", graph)):
                fn(x0).numpy()  # warm-up: kernels, pipelines, tracing
                samples = []
                for _ in range(a.reps):
                    t0 = time.perf_counter()
                    y = fn(x0).numpy()
                    samples.append((time.perf_counter() - t0) / (2 * steps) * 1e6)
                assert abs(y[0] - 2.0) < 1e-3, y  # the chain converges to b / (1 - m) = 2
                med = statistics.median(samples)
                out["results"].append({"device": dev, "mode": mode, "us_per_op": med, "samples": samples})
                print(f"{dev:8} {mode:12} {med:8.2f} us/op")
    by = {(r["device"], r["mode"]): r["us_per_op"] for r in out["results"]}
    for mode in ("eager", "tf.function"):
        if ("/GPU:0", mode) in by:
            print(f"{mode}: GPU/CPU host time per op {by[('/GPU:0', mode)] / by[('/CPU:0', mode)]:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
