#!/usr/bin/env python3
"""PyTorch (cuDNN) reference for `tfwgpu-bench conv`: the same cases, same JSON rows.

    python3 bench/torch_conv.py --cases resnet50 --json torch-conv.json

Each case: NHWC tensors (channels_last), cudnn.benchmark=True, float32 with TF32 off ("f32",
exact float32 products, the figure our kernels are compared with) and on ("tf32"). fwd is
conv2d, bwd_input torch.nn.grad.conv2d_input, bwd_filter torch.nn.grad.conv2d_weight
(depthwise cases: groups = channels). SAME padding as TensorFlow computes it (asymmetric pads
are applied with F.pad on the input for fwd; every ResNet-50 case here has symmetric or
TensorFlow-compatible pads, see `pads`). Timing: CUDA events around a batch of back-to-back
calls (~`--sample-ms` each) after a warm-up, median of `--reps`. Checked against float64 on
the CPU for 64 sampled outputs (relative to the sum of |terms|, like tfwgpu-bench).
Rows: {case, op, shape, dtype, ms, tflops, rel_err, impl: "torch"}.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def cc(name, n, hw, c, r, k, stride, depthwise=False):
    return dict(name=name, n=n, h=hw, w=hw, c=c, r=r, k=k, stride=stride, same=True,
                depthwise=depthwise)


CASES = [
    dict(name="demo1", n=128, h=28, w=28, c=1, r=3, k=32, stride=1, same=False, depthwise=False),
    dict(name="demo2", n=128, h=13, w=13, c=32, r=3, k=64, stride=1, same=False, depthwise=False),
    cc("resnet", 8, 56, 64, 3, 64, 1),
    cc("r50_conv1", 32, 224, 3, 7, 64, 2),
    cc("r50_56_1x1_64_64", 32, 56, 64, 1, 64, 1),
    cc("r50_56_3x3_64_64", 32, 56, 64, 3, 64, 1),
    cc("r50_56_3x3_64_64_b64", 64, 56, 64, 3, 64, 1),
    cc("r50_56_1x1_64_256", 32, 56, 64, 1, 256, 1),
    cc("r50_56_1x1_256_64", 32, 56, 256, 1, 64, 1),
    cc("r50_56_1x1_256_128_s2", 32, 56, 256, 1, 128, 2),
    cc("r50_56_3x3_128_128_s2", 32, 56, 128, 3, 128, 2),
    cc("r50_28_3x3_128_128", 32, 28, 128, 3, 128, 1),
    cc("r50_28_1x1_512_128", 32, 28, 512, 1, 128, 1),
    cc("r50_14_3x3_256_256", 32, 14, 256, 3, 256, 1),
    cc("r50_14_3x3_256_256_b64", 64, 14, 256, 3, 256, 1),
    cc("r50_14_1x1_1024_256", 32, 14, 1024, 1, 256, 1),
    cc("r50_7_3x3_512_512", 32, 7, 512, 3, 512, 1),
    cc("r50_7_1x1_2048_512", 32, 7, 2048, 1, 512, 1),
    cc("dw_56_3x3_128", 32, 56, 128, 3, 128, 1, depthwise=True),
    cc("dw_14_3x3_512", 32, 14, 512, 3, 512, 1, depthwise=True),
    # Products of the same size as 3x3 rows (tfwgpu-bench's gemm_* and wide cases).
    cc("gemm_28_1x1_1152_128", 32, 28, 1152, 1, 128, 1),
    cc("gemm_14_1x1_2304_256", 32, 14, 2304, 1, 256, 1),
    cc("gemm_7_1x1_4608_512", 32, 7, 4608, 1, 512, 1),
    cc("wide", 32, 28, 128, 3, 128, 1),
]


def groups_of(names):
    out = []
    for n in names:
        if n == "resnet50":
            out += [c["name"] for c in CASES if c["name"].startswith(("r50_", "dw_"))]
        elif n == "all":
            out += [c["name"] for c in CASES]
        else:
            out.append(n)
    return out


def geometry(c):
    """(oh, ow, pad_before, pad_after) as TensorFlow's SAME/VALID computes them."""
    s, r = c["stride"], c["r"]
    if c["same"]:
        oh = -(-c["h"] // s)
        need = max((oh - 1) * s + r - c["h"], 0)
        return oh, oh, need // 2, need - need // 2
    oh = (c["h"] - r) // s + 1
    return oh, oh, 0, 0


def shape_text(c):
    fc, fk = (c["c"], 1) if c["depthwise"] else (c["c"], c["k"])
    return (f"{c['n']}x{c['h']}x{c['w']}x{c['c']} {c['r']}x{c['r']}x{fc}x{fk} s{c['stride']} "
            f"{'SAME' if c['same'] else 'VALID'}{' depthwise' if c['depthwise'] else ''}")


def time_fn(fn, reps, target):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    one = start.elapsed_time(end) / 1e3
    inner = max(1, min(1000, int(target / max(one, 1e-7))))
    for _ in range(min(inner, 20)):
        fn()
    samples = []
    for _ in range(reps):
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(samples), inner


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="resnet50")
    ap.add_argument("--ops", default="fwd,bwd_input,bwd_filter")
    ap.add_argument("--modes", default="f32,tf32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sample-ms", type=float, default=20)
    ap.add_argument("--json", default="torch-conv.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    props = torch.cuda.get_device_properties(dev)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
          f"{torch.backends.cudnn.version()}, {props.name}")
    gen = torch.Generator(device=dev).manual_seed(5)
    rows = []
    byname = {c["name"]: c for c in CASES}
    print(f"{'case':>24} {'op':>10} {'mode':>5} {'ms':>9} {'TFLOP/s':>8} {'rel err':>8}")
    for name in groups_of(args.cases.split(",")):
        c = byname.get(name)
        if c is None:
            print(f"{name:>24} skipped: no such case here")
            continue
        oh, ow, pb, pa = geometry(c)
        groups = c["c"] if c["depthwise"] else 1
        cin_g = 1 if c["depthwise"] else c["c"]
        flops = 2.0 * c["n"] * oh * ow * c["k"] * c["r"] * c["r"] * cin_g
        x = (torch.rand((c["n"], c["c"], c["h"], c["w"]), device=dev, generator=gen) * 2 - 1)
        x = x.contiguous(memory_format=torch.channels_last)
        wt = (torch.rand((c["k"], cin_g, c["r"], c["r"]), device=dev, generator=gen) * 2 - 1)
        wt = wt.contiguous(memory_format=torch.channels_last)
        dy = (torch.rand((c["n"], c["k"], oh, ow), device=dev, generator=gen) * 2 - 1)
        dy = dy.contiguous(memory_format=torch.channels_last)
        # Asymmetric SAME padding (pad after > before): pad the input explicitly and crop the
        # input gradient; symmetric pads go to cuDNN.
        sym = pb == pa
        xp = x if sym else F.pad(x, (pb, pa, pb, pa)).contiguous(memory_format=torch.channels_last)
        pad = pb if sym else 0
        s = c["stride"]

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
            for mode in args.modes.split(","):
                tf32 = mode == "tf32"
                torch.backends.cuda.matmul.allow_tf32 = tf32
                torch.backends.cudnn.allow_tf32 = tf32
                out = fns[op]().float()
                err = check(c, op, x, wt, dy, out, (oh, ow, pb))
                med, inner = time_fn(fns[op], args.reps, args.sample_ms / 1e3)
                tfl = flops / med / 1e12
                print(f"{name:>24} {op:>10} {mode:>5} {med * 1e3:>9.4f} {tfl:>8.2f} {err:>8.1e}",
                      flush=True)
                rows.append({"case": name, "op": op, "shape": shape_text(c), "dtype": mode,
                             "impl": "torch", "ms": med * 1e3, "tflops": tfl, "rel_err": err,
                             "inner": inner, "reps": args.reps})
        torch.backends.cudnn.allow_tf32 = False
        del x, wt, dy, xp
    doc = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "device": props.name, "results": rows}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=2)
    print(f"wrote {args.json}")


def check(c, op, x, wt, dy, out, geo, samples=64):
    """Largest |got - want| / sum|terms| over sampled outputs, want in float64 (NCHW indexing)."""
    oh, ow, pb = geo
    s, r = c["stride"], c["r"]
    g = torch.Generator().manual_seed(1)
    worst = 0.0
    dw = c["depthwise"]

    def ri(hi):
        return int(torch.randint(hi, (1,), generator=g))

    for _ in range(samples):
        if op == "fwd":
            n, k, oy, ox = ri(c["n"]), ri(c["k"]), ri(oh), ri(ow)
            chans = slice(k, k + 1) if dw else slice(0, c["c"])
            terms = []
            for dr in range(r):
                for ds in range(r):
                    y, xx = oy * s + dr - pb, ox * s + ds - pb
                    if 0 <= y < c["h"] and 0 <= xx < c["w"]:
                        terms.append(x[n, chans, y, xx].double() * wt[k, :, dr, ds].double())
            got = out[n, k, oy, ox]
        elif op == "bwd_input":
            n, ch, y, xx = ri(c["n"]), ri(c["c"]), ri(c["h"]), ri(c["w"])
            ks = slice(ch, ch + 1) if dw else slice(0, c["k"])
            terms = []
            for dr in range(r):
                for ds in range(r):
                    ty, tx = y + pb - dr, xx + pb - ds
                    if ty < 0 or tx < 0 or ty % s or tx % s:
                        continue
                    oy, ox = ty // s, tx // s
                    if oy < oh and ox < ow:
                        wv = wt[ch, 0, dr, ds] if dw else wt[:, ch, dr, ds]
                        terms.append(dy[n, ks, oy, ox].double() * wv.double())
            got = out[n, ch, y, xx]
        else:
            k, dr, ds = ri(c["k"]), ri(r), ri(r)
            ch = k if dw else ri(c["c"])
            ys = torch.arange(oh, device=x.device) * s + dr - pb
            xs = torch.arange(ow, device=x.device) * s + ds - pb
            vy = (ys >= 0) & (ys < c["h"])
            vx = (xs >= 0) & (xs < c["w"])
            xv = x[:, ch][:, ys.clamp(0, c["h"] - 1)][:, :, xs.clamp(0, c["w"] - 1)].double()
            mask = (vy[:, None] & vx[None, :]).double()
            terms = [(xv * mask * dy[:, k].double()).flatten()]
            got = out[k, 0 if dw else ch, dr, ds]
        if terms:
            t = torch.cat([v.flatten() for v in terms])
            want, scale = t.sum().item(), t.abs().sum().item()
        else:
            want, scale = 0.0, 0.0
        err = abs(float(got) - want) / max(scale, 1e-300)
        worst = max(worst, err if float(got) == float(got) else float("inf"))
    return worst


if __name__ == "__main__":
    main()
