#!/usr/bin/env python3
"""PyTorch on CUDA: the reference figures beside `tfwgpu-bench matmul` on the same GPU.

    python3 bench/torch_ref.py --sizes 512,1024,2048,4096 --json torch-matmul.json

For each square size: float32 with TF32 off (exact float32 arithmetic, the figure our float32
kernels are measured against), float32 with TF32 on, and float16 (float32 accumulation, as
cuBLAS does by default). Timing: CUDA events around a batch of back-to-back products (enough
to last ~20 ms), after a warm-up; the median of `--reps` batches is reported. Inputs are
uniform in [-1, 1) (never zeros) and reused across products like tfwgpu-bench's. The result
of each mode is checked against a float64 product (||out - ref|| / ||ref||).
"""
import argparse
import json
import statistics

import torch

MODES = [("f32", torch.float32, False), ("tf32", torch.float32, True), ("f16", torch.float16, False)]


def time_mm(a, b, reps):
    c = torch.mm(a, b)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.mm(a, b, out=c)
    end.record()
    torch.cuda.synchronize()
    one = start.elapsed_time(end) / 1e3
    inner = max(1, min(2000, int(0.02 / max(one, 1e-7))))
    for _ in range(inner):  # warm-up
        torch.mm(a, b, out=c)
    samples = []
    for _ in range(reps):
        start.record()
        for _ in range(inner):
            torch.mm(a, b, out=c)
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(samples), min(samples), max(samples), inner


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="512,1024,2048,4096")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default="torch-matmul.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {props.name}, "
          f"{props.multi_processor_count} SMs")
    gen = torch.Generator(device=dev).manual_seed(7)
    rows = []
    print(f"{'size':>6} {'mode':>5} {'median ms':>10} {'TFLOP/s':>8} {'min ms':>8} {'max ms':>8} {'rel err':>8}")
    for n in [int(x) for x in args.sizes.split(",")]:
        a32 = torch.rand((n, n), device=dev, generator=gen) * 2 - 1
        b32 = torch.rand((n, n), device=dev, generator=gen) * 2 - 1
        ref = torch.mm(a32.double(), b32.double())
        for name, dtype, tf32 in MODES:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
            a, b = a32.to(dtype), b32.to(dtype)
            err = ((torch.mm(a, b).double() - ref).norm() / ref.norm()).item()
            med, lo, hi, inner = time_mm(a, b, args.reps)
            tflops = 2 * n**3 / med / 1e12
            print(f"{n:>6} {name:>5} {med * 1e3:>10.4f} {tflops:>8.2f} {lo * 1e3:>8.4f} {hi * 1e3:>8.4f} {err:>8.1e}")
            rows.append({"m": n, "n": n, "k": n, "mode": name, "median_ms": med * 1e3,
                         "min_ms": lo * 1e3, "max_ms": hi * 1e3, "tflops": tflops,
                         "gflops": tflops * 1e3, "rel_err": err, "inner": inner, "reps": args.reps})
        torch.backends.cuda.matmul.allow_tf32 = False
    doc = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": props.name,
           "sms": props.multi_processor_count, "results": rows}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
