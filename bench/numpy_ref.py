#!/usr/bin/env python3
"""NumPy float32 matmul on the CPU: the reference figure beside `tfwgpu-bench matmul` on a
CPU adapter (lavapipe) of the same machine.

    python bench/numpy_ref.py --sizes 128,256,512 --reps 7 --json numpy-matmul.json

BLAS threads are pinned to the cores this process may run on (sched_getaffinity), set before
NumPy loads. Each sample times enough back-to-back products to last ~0.2 s; the median
sample is reported. Inputs are uniform in [-1, 1) like tfwgpu-bench's; the result is checked
against a float64 product (max relative error over sampled entries, scaled by sum |a b|).
"""
import argparse
import json
import os
import platform
import time

THREADS = str(len(os.sched_getaffinity(0)))
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ.setdefault(var, THREADS)

import numpy as np  # noqa: E402


def bench(n, reps, rng):
    a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    c = a @ b  # warm-up
    idx = rng.integers(0, n, (256, 2))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = np.array([a64[i] @ b64[:, j] for i, j in idx])
    scale = np.array([np.abs(a64[i] * b64[:, j]).sum() for i, j in idx])
    got = c[idx[:, 0], idx[:, 1]].astype(np.float64)
    rel_err = float(np.max(np.abs(got - want) / scale))
    t0 = time.perf_counter()
    a @ b
    one = time.perf_counter() - t0
    inner = max(1, min(1000, int(0.2 / max(one, 1e-9))))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            np.matmul(a, b, out=c)
        samples.append((time.perf_counter() - t0) / inner)
    med = float(np.median(samples))
    return {"op": "matmul", "dtype": "float32", "m": n, "n": n, "k": n,
            "median_ms": med * 1e3, "gflops": 2 * n**3 / med / 1e9, "rel_err": rel_err,
            "inner": inner, "reps": reps}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="128,256,512")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", default="numpy-matmul.json")
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    blas = "unknown"
    try:
        cfg = np.show_config(mode="dicts")
        blas = "{} {}".format(cfg["Build Dependencies"]["blas"]["name"],
                              cfg["Build Dependencies"]["blas"].get("version", ""))
    except Exception:
        pass
    print(f"numpy {np.__version__}, BLAS {blas}, {THREADS} thread(s), {platform.processor() or platform.machine()}")
    print(f"{'size':>6} {'median ms':>12} {'GFLOP/s':>10} {'rel err':>10}")
    rows = []
    for s in [int(x) for x in args.sizes.split(",")]:
        r = bench(s, args.reps, rng)
        print(f"{s:>6} {r['median_ms']:>12.3f} {r['gflops']:>10.1f} {r['rel_err']:>10.1e}")
        rows.append(r)
    doc = {"numpy": np.__version__, "blas": blas, "threads": int(THREADS), "results": rows}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
