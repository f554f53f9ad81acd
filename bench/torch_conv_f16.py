#!/usr/bin/env python3
"""PyTorch (cuDNN) float16 Conv2D on the cases of `tfwgpu-bench conv --dtype f16`: the same
cases, ops, rows and checks as bench/torch_conv.py (imported from the same folder), with
float16 tensors (float32 accumulation inside cuDNN) and, with --modes f16,f32, float32 (TF32
off) on the same values, channels_last, cudnn.benchmark.

    python3 bench/torch_conv_f16.py --cases resnet,wide,resnet50 --ops fwd,bwd_input,bwd_filter --json torch-conv-f16.json

Rows: {case, op, shape, dtype: "f16", impl: "torch", ms, tflops, rel_err}; rel_err is
against float64 sums of the float16 inputs (relative to the sum of |terms|).
"""
import argparse
import json

import torch
import torch.nn.functional as F

import torch_conv as tc

EXTRA = [tc.cc("wide", 32, 28, 128, 3, 128, 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="resnet,wide")
    ap.add_argument("--ops", default="fwd,bwd_input,bwd_filter")
    ap.add_argument("--modes", default="f16", help="f16 and/or f32 (TF32 off)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sample-ms", type=float, default=15)
    ap.add_argument("--json", default="torch-conv-f16.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    props = torch.cuda.get_device_properties(dev)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
          f"{torch.backends.cudnn.version()}, {props.name}")
    gen = torch.Generator(device=dev).manual_seed(5)
    byname = {c["name"]: c for c in tc.CASES + EXTRA}
    rows = []
    print(f"{'case':>24} {'op':>10} {'mode':>5} {'ms':>9} {'TFLOP/s':>8} {'rel err':>8}")
    for name in tc.groups_of(args.cases.split(",")):
        c = byname[name]
        oh, ow, pb, pa = tc.geometry(c)
        groups = c["c"] if c["depthwise"] else 1
        cin_g = 1 if c["depthwise"] else c["c"]
        flops = 2.0 * c["n"] * oh * ow * c["k"] * c["r"] * c["r"] * cin_g

        def rnd(shape):
            t = torch.rand(shape, device=dev, generator=gen) * 2 - 1
            return t.half().contiguous(memory_format=torch.channels_last)

        x16 = rnd((c["n"], c["c"], c["h"], c["w"]))
        wt16 = rnd((c["k"], cin_g, c["r"], c["r"]))
        dy16 = rnd((c["n"], c["k"], oh, ow))
        for mode in args.modes.split(","):
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            dt = torch.float16 if mode == "f16" else torch.float32
            x, wt, dy = (t.to(dt).contiguous(memory_format=torch.channels_last)
                         for t in (x16, wt16, dy16))
            rows += run_case(c, name, mode, args, x, wt, dy, (oh, ow, pb, pa), groups, flops)
        del x16, wt16, dy16
    doc = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "device": props.name, "results": rows}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=2)
    print(f"wrote {args.json}")


def run_case(c, name, mode, args, x, wt, dy, geo, groups, flops):
    oh, ow, pb, pa = geo
    sym = pb == pa
    xp = x if sym else F.pad(x, (pb, pa, pb, pa)).contiguous(memory_format=torch.channels_last)
    pad = pb if sym else 0
    s = c["stride"]
    rows = []

    def fwd():
        return F.conv2d(xp, wt, stride=s, padding=pad, groups=groups)

    def bwd_input():
        g = torch.nn.grad.conv2d_input(xp.shape, wt, dy, stride=s, padding=pad, groups=groups)
        return g if sym else g[:, :, pb:pb + c["h"], pb:pb + c["w"]]

    def bwd_filter():
        return torch.nn.grad.conv2d_weight(xp, wt.shape, dy, stride=s, padding=pad,
                                           groups=groups)

    fns = {"fwd": fwd, "bwd_input": bwd_input, "bwd_filter": bwd_filter}
    for op in args.ops.split(","):
        out = fns[op]().float()
        err = tc.check(c, op, x.float(), wt.float(), dy.float(), out, (oh, ow, pb))
        med, inner = tc.time_fn(fns[op], args.reps, args.sample_ms / 1e3)
        tfl = flops / med / 1e12
        print(f"{name:>24} {op:>10} {mode:>5} {med * 1e3:>9.4f} {tfl:>8.2f} {err:>8.1e}",
              flush=True)
        rows.append({"case": name, "op": op, "shape": tc.shape_text(c), "dtype": mode,
                     "impl": "torch", "ms": med * 1e3, "tflops": tfl, "rel_err": err,
                     "inner": inner, "reps": args.reps})
    return rows


if __name__ == "__main__":
    main()
