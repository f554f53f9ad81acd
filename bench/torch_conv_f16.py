#!/usr/bin/env python3
"""PyTorch (cuDNN) Conv2D forward on the cases of `tfwgpu-bench conv` (resnet: 8x56x56x64 ->
64 3x3 SAME, wide: 32x28x28x128 -> 128 3x3 SAME): float32 (TF32 off), TF32, float16, in
channels-last layout, timed with CUDA events (median of --reps batches of ~20 ms).

    python3 bench/torch_conv_f16.py --cases resnet,wide --json torch-conv.json
"""
import argparse
import json
import statistics

import torch

CASES = {"resnet": (8, 56, 56, 64, 3, 64), "wide": (32, 28, 28, 128, 3, 128)}


def bench(fn, reps):
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    inner = max(1, min(1000, int(0.02 / max(s.elapsed_time(e) / 1e3, 1e-7))))
    out = []
    for _ in range(reps):
        s.record()
        for _ in range(inner):
            fn()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e) / 1e3 / inner)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="resnet,wide")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="torch-conv.json")
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    rows = []
    for name in a.cases.split(","):
        n, h, w, c, r, k = CASES[name]
        flops = 2.0 * n * h * w * k * r * r * c
        for mode, dt, tf32 in [("f32", torch.float32, False), ("tf32", torch.float32, True),
                               ("f16", torch.float16, False)]:
            torch.backends.cudnn.allow_tf32 = tf32
            x = (torch.rand(n, c, h, w, device="cuda") * 2 - 1).to(dt)
            x = x.to(memory_format=torch.channels_last)
            f = (torch.rand(k, c, r, r, device="cuda") * 2 - 1).to(dt)
            f = f.to(memory_format=torch.channels_last)
            t = bench(lambda: torch.nn.functional.conv2d(x, f, padding=r // 2), a.reps)
            print(f"{name:>7} {mode:>5} {t * 1e3:9.3f} ms {flops / t / 1e12:8.1f} TFLOP/s")
            rows.append({"case": name, "mode": mode, "median_ms": t * 1e3,
                         "tflops": flops / t / 1e12})
    json.dump({"torch": torch.__version__, "results": rows}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
