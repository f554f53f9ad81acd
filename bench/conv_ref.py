#!/usr/bin/env python3
"""TensorFlow's own CPU kernels (oneDNN) on the convolutions of `tfwgpu-bench conv`: the
reference figure beside it on a CPU adapter (lavapipe) of the same machine.

    python bench/conv_ref.py --cases demo1,demo2,resnet --reps 3 --json tf-conv.json

Same cases as tfwgpu-bench (float32, NHWC, stride 1; demo1: 128x28x28x1 -> 32 3x3 VALID,
demo2: 128x13x13x32 -> 64 3x3 VALID, resnet: 8x56x56x64 -> 64 3x3 SAME), same three ops
(tf.raw_ops.Conv2D, Conv2DBackpropInput, Conv2DBackpropFilter) pinned to /CPU:0, eager, each
result fetched with .numpy(). Each sample times enough back-to-back runs to last ~0.2 s; the
median sample is reported.
"""
import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

CASES = {
    "demo1": (128, 28, 28, 1, 3, 32, "VALID"),
    "demo2": (128, 13, 13, 32, 3, 64, "VALID"),
    "resnet": (8, 56, 56, 64, 3, 64, "SAME"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="demo1,demo2,resnet")
    ap.add_argument("--ops", default="fwd,bwd_input,bwd_filter")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default="tf-conv.json")
    args = ap.parse_args()
    rng = np.random.default_rng(11)
    print(f"tensorflow {tf.__version__}, {len(os.sched_getaffinity(0))} core(s) visible")
    print(f"{'case':>7} {'op':>10} {'median ms':>10} {'GFLOP/s':>10}")
    rows = []
    for name in args.cases.split(","):
        n, h, w, c, r, k, pad = CASES[name]
        oh, ow = (h, w) if pad == "SAME" else (h - r + 1, w - r + 1)
        flops = 2.0 * n * oh * ow * k * r * r * c
        with tf.device("/CPU:0"):
            x = tf.constant(rng.uniform(-1, 1, (n, h, w, c)).astype(np.float32))
            f = tf.constant(rng.uniform(-1, 1, (r, r, c, k)).astype(np.float32))
            dy = tf.constant(rng.uniform(-1, 1, (n, oh, ow, k)).astype(np.float32))
            kw = dict(strides=[1, 1, 1, 1], padding=pad)
            fns = {
                "fwd": lambda: tf.raw_ops.Conv2D(input=x, filter=f, **kw),
                "bwd_input": lambda: tf.raw_ops.Conv2DBackpropInput(
                    input_sizes=tf.constant([n, h, w, c]), filter=f, out_backprop=dy, **kw),
                "bwd_filter": lambda: tf.raw_ops.Conv2DBackpropFilter(
                    input=x, filter_sizes=tf.constant([r, r, c, k]), out_backprop=dy, **kw),
            }
            for op in args.ops.split(","):
                fn = fns[op]
                fn().numpy()  # warm-up
                t0 = time.perf_counter()
                fn().numpy()
                one = time.perf_counter() - t0
                inner = max(1, min(100, int(0.2 / max(one, 1e-9))))
                samples = []
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    for _ in range(inner):
                        fn().numpy()
                    samples.append((time.perf_counter() - t0) / inner)
                med = float(np.median(samples))
                print(f"{name:>7} {op:>10} {med * 1e3:>10.2f} {flops / med / 1e9:>10.2f}")
                rows.append({"case": name, "op": op, "median_ms": med * 1e3,
                             "gflops": flops / med / 1e9, "inner": inner, "reps": args.reps})
    with open(args.json, "w") as fh:
        json.dump({"tensorflow": tf.__version__, "results": rows}, fh, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
