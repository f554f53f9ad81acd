#!/usr/bin/env python3
"""PyTorch on CUDA: the reference figures beside `tfwgpu-bench` on the same GPU.

    python3 bench/torch_ref.py --json torch-ops.json            # the `tfwgpu-bench ops` cases
    python3 bench/torch_ref.py --cases matmul_4096,copy_256MiB  # a few of them
    python3 bench/torch_ref.py --sizes 512,1024,4096 --json t.json   # square matmuls only
                                                   # (--transpose a|b|ab; tfwgpu-bench matmul
                                                   # --torch runs this form)

The cases have the names and shapes of `tfwgpu-bench ops` (same rules, same `--small` preset;
`--list` prints them), and the rows the same JSON schema: {case, op, shape, dtype, mode, ms,
tflops | gbps, pct_copy, rel_err} (bench/compare.py reads both). MatMul and BatchMatMul run in
three modes: float32 with TF32 off (exact float32 arithmetic, what our float32 kernels are
measured against), float32 with TF32 on, and float16 (float32 accumulation, cuBLAS's default).
The memory-bound cases run in float32 ("f32"); their bytes are what the op must read and
write at least (the same count as tfwgpu-bench), `pct_copy` is relative to PyTorch's own
device copy (`Tensor.copy_`) of the same run, which is named `copy_<MiB>MiB` (our copies are
copy_buffer_/copy_u32_/copy_vec4_; compare.py pairs them).

Timing: CUDA events around a batch of back-to-back calls (enough to last ~20 ms) after a
warm-up; the median of `--reps` batches. Errors: matmul ||out - ref|| / ||ref|| against float64;
the other ops the largest |out - ref| / scale against float64 (scale as in tfwgpu-bench).
Deviation: MaxPool uses padding=1 on both sides where TensorFlow's SAME pads 0 before and 1
after (same output shape and byte count, windows shifted by one pixel).
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

MODES = [("f32", torch.float32, False), ("tf32", torch.float32, True), ("f16", torch.float16, False)]


def dims(*d):
    return "x".join(str(x) for x in d)


# ---- the case list: mirrors all_cases() in crates/bench/src/ops.rs ----

def mm(batch, m, k, n, ta=False, tb=False):
    if batch == 0:
        sizes = str(m) if m == k == n else dims(m, k, n)
        name = f"matmul_{sizes}" + ("_ta" if ta else "") + ("_tb" if tb else "")
    else:
        name = f"bmm_{dims(batch, m, k, n)}" + ("_adjx" if ta else "") + ("_adjy" if tb else "")
    return {"name": name, "kind": "matmul", "batch": batch, "m": m, "k": k, "n": n, "ta": ta, "tb": tb}


def binary(rows, cols):
    return [
        {"name": f"add_bcast_{dims(rows, cols)}", "kind": "binary", "op": "AddV2", "rows": rows,
         "cols": cols, "bcast": True},
        {"name": f"mul_{dims(rows, cols)}", "kind": "binary", "op": "Mul", "rows": rows,
         "cols": cols, "bcast": False},
    ]


def reduce(rows, cols):
    return [{"name": f"{op.lower()}_{'last' if axis == 1 else 'first'}_{dims(rows, cols)}",
             "kind": "reduce", "op": op, "rows": rows, "cols": cols, "axis": axis}
            for op in ("Sum", "Max") for axis in (1, 0)]


def all_cases(small):
    v = []
    if small:
        v.append({"name": "copy_4MiB", "kind": "copy", "elems": 1 << 20})
        v += [mm(0, s, s, s) for s in (128, 256, 512)]
        v += [mm(0, 256, 256, 256, ta=True), mm(0, 256, 256, 256, tb=True),
              mm(0, 64, 2048, 1000), mm(0, 1024, 64, 1024), mm(0, 4096, 256, 256),
              mm(8, 128, 64, 128, tb=True), mm(8, 128, 128, 64)]
        v += binary(1024, 1024) + reduce(1024, 1024)
        v += [{"name": "softmax_1024x1000", "kind": "softmax", "rows": 1024, "cols": 1000},
              {"name": "softmax_32x32768", "kind": "softmax", "rows": 32, "cols": 32768}]
        bn, bn2, bn16, pool, pool2 = ([(4, 56, 56, 64)], [(8, 14, 14, 256)], [(8, 14, 14, 256)],
                                      None, (4, 112, 112, 64))
        f16 = [(4, 14, 14, 256)]
        biasgrad = [(4, 28, 28, 64)]
    else:
        v.append({"name": "copy_256MiB", "kind": "copy", "elems": 64 << 20})
        # Small copies, only when named: the least one kernel launch costs (beside the small
        # batch-norm rows; tfwgpu-bench's copy_vec4x4_4KiB, _256KiB, _2MiB).
        v += [{"name": f"copy_{n}", "kind": "copy", "elems": e}
              for n, e in (("4KiB", 1 << 10), ("256KiB", 1 << 16), ("2MiB", 1 << 19))]
        v += [mm(0, s, s, s) for s in (512, 1024, 2048, 4096, 8192)]
        v += [mm(0, 4096, 4096, 4096, ta=True), mm(0, 4096, 4096, 4096, tb=True),
              mm(0, 64, 2048, 1000), mm(0, 64, 1000, 2048, tb=True), mm(0, 64, 1152, 10),
              mm(0, 4096, 64, 4096),
              mm(0, 32768, 256, 256),
              mm(32, 512, 64, 512, tb=True), mm(32, 512, 512, 64), mm(8, 1024, 1024, 1024)]
        v += binary(65536, 1024) + binary(1024, 1024) + reduce(8192, 8192)
        v += [{"name": "softmax_65536x1000", "kind": "softmax", "rows": 65536, "cols": 1000},
              {"name": "softmax_2048x32768", "kind": "softmax", "rows": 2048, "cols": 32768}]
        bn, bn2, bn16, pool, pool2 = ([(32, 56, 56, 64), (32, 14, 14, 256)], RESNET50_BN,
                                      [(64, 56, 56, 256), (64, 14, 14, 1024), (64, 7, 7, 2048)],
                                      (32, 112, 112, 64), (64, 112, 112, 64))
        f16 = [(64, 56, 56, 256), (64, 14, 14, 1024)]
        biasgrad = [(64, 112, 112, 64), (64, 56, 56, 256), (64, 14, 14, 1024)]
    v += [{"name": f"bn_train_{dims(*s)}", "kind": "bn", "shape": s} for s in bn]
    for half, shapes in ((False, bn2), (True, bn16)):
        sfx = "_f16" if half else ""
        for s in shapes:
            v += [{"name": f"bn_train_{dims(*s)}{sfx}", "kind": "bn", "shape": s, "half": half},
                  {"name": f"bn_grad_{dims(*s)}{sfx}", "kind": "bn_grad", "shape": s, "half": half}]
    if pool:
        v.append({"name": f"maxpool3s2_{dims(*pool)}", "kind": "maxpool", "shape": pool})
    for half in (False, True):
        sfx = "_f16" if half else ""
        v += [{"name": f"maxpool3s2_{dims(*pool2)}{sfx}", "kind": "maxpool", "shape": pool2, "half": half},
              {"name": f"maxpoolgrad3s2_{dims(*pool2)}{sfx}", "kind": "maxpool_grad", "shape": pool2,
               "half": half}]
    for s in f16:
        v += [{"name": f"cast_f32_f16_{dims(*s)}", "kind": "cast", "shape": s, "half": False},
              {"name": f"cast_f16_f32_{dims(*s)}", "kind": "cast", "shape": s, "half": True},
              {"name": f"add_{dims(*s)}_f16", "kind": "add_same", "shape": s, "half": True},
              {"name": f"add_{dims(*s)}", "kind": "add_same", "shape": s, "half": False}]
    for s in biasgrad:
        v += [{"name": f"biasgrad_{dims(*s)}{sfx}", "kind": "bias_grad", "shape": s, "half": half}
              for half, sfx in ((False, ""), (True, "_f16"))]
    return v


# Batch-norm shapes of ResNet-50 at batch 64 (NHWC): forward and gradient cases.
RESNET50_BN = [(64, 112, 112, 64), (64, 56, 56, 256), (64, 28, 28, 512), (64, 14, 14, 1024),
               (64, 7, 7, 2048)]


# ---- timing ----

def time_fn(fn, reps):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    torch.cuda.synchronize()
    one = start.elapsed_time(end) / 3e3
    inner = max(1, min(2000, int(0.02 / max(one, 1e-7))))
    for _ in range(inner):  # warm-up
        fn()
    samples = []
    for _ in range(reps):
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(samples), min(samples), inner


def uniform(gen, *shape):
    return torch.rand(shape, device="cuda", generator=gen) * 2 - 1


def max_rel(got, want, scale):
    got, want, scale = got.double(), want.double(), scale.double().abs()
    err = (got - want).abs() / scale.clamp_min(torch.finfo(torch.float64).tiny)
    err = torch.where(got == want, torch.zeros_like(err), err)
    if torch.isnan(got).any():
        return float("inf")
    return err.max().item()


# ---- the cases ----

def run_matmul(c, gen, reps):
    b, m, k, n, ta, tb = c["batch"], c["m"], c["k"], c["n"], c["ta"], c["tb"]
    bb = max(b, 1)
    sa = (k, m) if ta else (m, k)
    sb = (n, k) if tb else (k, n)
    a32 = uniform(gen, bb, *sa)
    b32 = uniform(gen, bb, *sb)
    if b == 0:
        a32, b32 = a32[0], b32[0]
    tr = (lambda t: t.transpose(-1, -2))
    op_a = (lambda t: tr(t)) if ta else (lambda t: t)
    op_b = (lambda t: tr(t)) if tb else (lambda t: t)
    ref = torch.matmul(op_a(a32.double()), op_b(b32.double()))
    rows = []
    for mode, dtype, tf32 in MODES:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        x, y = a32.to(dtype), b32.to(dtype)
        out = torch.matmul(op_a(x), op_b(y))
        err = ((out.double() - ref).norm() / ref.norm()).item()
        med, lo, inner = time_fn(lambda: torch.matmul(op_a(x), op_b(y), out=out), reps)
        flops = 2.0 * bb * m * k * n
        shape = [([b] if b else []) + list(sa), ([b] if b else []) + list(sb)]
        rows.append({"case": c["name"], "op": "MatMul" if b == 0 else "BatchMatMulV2",
                     "shape": shape, "dtype": "float16" if dtype == torch.float16 else "float32",
                     "mode": mode, "ms": med * 1e3, "min_ms": lo * 1e3, "flops": flops,
                     "tflops": flops / med / 1e12, "pct_copy": None, "rel_err": err,
                     "inner": inner, "reps": reps})
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return rows


def run_membound(c, gen, reps):
    kind = c["kind"]
    if kind == "copy":
        src = uniform(gen, c["elems"])
        dst = torch.full_like(src, float("nan"))
        fn = lambda: dst.copy_(src)  # noqa: E731
        fn()
        err = 0.0 if torch.equal(dst, src) else float("inf")
        return "copy (torch copy_)", [[c["elems"]]], 2.0 * src.numel() * 4, fn, err
    if kind == "binary":
        r, cc = c["rows"], c["cols"]
        a = uniform(gen, r, cc)
        b = uniform(gen, cc) if c["bcast"] else uniform(gen, r, cc)
        out = torch.full_like(a, float("nan"))
        f = torch.add if c["op"] == "AddV2" else torch.mul
        fn = lambda: f(a, b, out=out)  # noqa: E731
        fn()
        want = f(a.double(), b.double())
        scale = a.double().abs() + b.double().abs() if c["op"] == "AddV2" else want
        return c["op"], [list(a.shape), list(b.shape)], (2 * a.numel() + b.numel()) * 4.0, fn, \
            max_rel(out, want, scale)
    if kind == "reduce":
        r, cc, axis = c["rows"], c["cols"], c["axis"]
        x = uniform(gen, r, cc)
        out = torch.full((r if axis == 1 else cc,), float("nan"), device="cuda")
        if c["op"] == "Sum":
            fn = lambda: torch.sum(x, dim=axis, out=out)  # noqa: E731
            want, scale = x.double().sum(axis), x.double().abs().sum(axis)
        else:
            fn = lambda: torch.amax(x, dim=axis, out=out)  # noqa: E731
            want = x.double().amax(axis)
            scale = want
        fn()
        return c["op"], [[r, cc], [1]], (x.numel() + out.numel()) * 4.0, fn, max_rel(out, want, scale)
    if kind == "softmax":
        x = uniform(gen, c["rows"], c["cols"])
        fn = lambda: torch.softmax(x, dim=-1)  # noqa: E731
        out = fn()
        want = torch.softmax(x.double(), dim=-1)
        return "Softmax", [list(x.shape)], 2.0 * x.numel() * 4, fn, max_rel(out, want, want)
    # float16 cases: T = half tensors, float32 statistics and parameters (cuDNN's mixed mode,
    # what Keras' mixed precision runs); the bytes count 2 per element.
    half = c.get("half", False)
    dt, esize = (torch.float16, 2) if half else (torch.float32, 4)
    if kind == "bn":
        n, h, w, ch = c["shape"]
        x = (uniform(gen, n, h, w, ch) + 2).to(dt).permute(0, 3, 1, 2)  # NCHW view of NHWC memory
        assert x.is_contiguous(memory_format=torch.channels_last)
        gamma, beta = uniform(gen, ch), uniform(gen, ch)
        rm, rv = torch.zeros(ch, device="cuda"), torch.ones(ch, device="cuda")
        fn = lambda: F.batch_norm(x, rm, rv, gamma, beta, training=True, momentum=1.0, eps=1e-3)  # noqa: E731
        y = fn()
        xd = x.double()
        mean = xd.mean((0, 2, 3), keepdim=True)
        var = xd.var((0, 2, 3), unbiased=False, keepdim=True)
        inv = (var + 1e-3).rsqrt() * gamma.double().view(1, -1, 1, 1)
        want = (xd - mean) * inv + beta.double().view(1, -1, 1, 1)
        # x - mean rounds relative to |x| + |mean|, not |x - mean| (which cancels).
        scale = (xd.abs() + mean.abs()) * inv.abs() + beta.double().abs().view(1, -1, 1, 1)
        return "FusedBatchNormV3", [[n, h, w, ch], [ch], [ch], [ch], [ch]], \
            2.0 * x.numel() * esize + 7 * ch * 4, fn, max_rel(y, want, scale)
    if kind == "bn_grad":
        # The training backward kernel alone (aten's native_batch_norm_backward: cuDNN's or
        # the native channels-last kernel), given the saved mean and inverse std.
        n, h, w, ch = c["shape"]
        x = (uniform(gen, n, h, w, ch) + 2).to(dt).permute(0, 3, 1, 2)
        dy = uniform(gen, n, h, w, ch).to(dt).permute(0, 3, 1, 2)
        gamma = uniform(gen, ch)
        xd = x.double()
        mean = xd.mean((0, 2, 3))
        var = xd.var((0, 2, 3), unbiased=False)
        invstd = (var + 1e-3).rsqrt()
        sm, si = mean.float(), invstd.float()
        fn = lambda: torch.ops.aten.native_batch_norm_backward(  # noqa: E731
            dy, x, gamma, None, None, sm, si, True, 1e-3, [True, True, True])
        dx, dg, db = fn()
        v = lambda t: t.view(1, -1, 1, 1)  # noqa: E731
        dyd, xc = dy.double(), xd - v(mean)
        r = n * h * w
        sdy, sdyx = dyd.sum((0, 2, 3)), (dyd * xc).sum((0, 2, 3))
        ady = dyd.abs().sum((0, 2, 3))
        adx = (dyd.abs() * (xd.abs() + v(mean).abs())).sum((0, 2, 3))
        k = gamma.double() * invstd
        want = v(k) * ((dyd - v(sdy) / r) - xc * v(invstd ** 2 * sdyx / r))
        scale = v(k).abs() * (dyd.abs() + v(ady) / r + (xd.abs() + v(mean).abs()) * v(invstd ** 2 * adx / r))
        err = max(max_rel(dx, want, scale), max_rel(dg, sdyx * invstd, adx * invstd), max_rel(db, sdy, ady))
        return "FusedBatchNormGradV3", [[n, h, w, ch], [n, h, w, ch], [ch], [ch], [ch]], \
            3.0 * x.numel() * esize + 5 * ch * 4, fn, err
    if kind == "cast":
        # c["half"]: the source is float16 (float16 -> float32), else float32 -> float16.
        shape = c["shape"]
        src_t, dst_t = (torch.float16, torch.float32) if half else (torch.float32, torch.float16)
        x = uniform(gen, *shape).to(src_t)
        out = torch.empty(shape, dtype=dst_t, device="cuda")
        fn = lambda: out.copy_(x)  # noqa: E731
        fn()
        err = 0.0 if torch.equal(out, x.to(dst_t)) else float("inf")
        return "Cast", [list(shape)], 6.0 * x.numel(), fn, err
    if kind == "bias_grad":
        # The bias gradient of an NHWC tensor: the per-channel sum over N, H, W.
        shape = c["shape"]
        x = uniform(gen, *shape).to(dt)
        out = torch.empty(shape[-1], dtype=dt, device="cuda")
        fn = lambda: torch.sum(x, dim=(0, 1, 2), out=out)  # noqa: E731
        fn()
        xd = x.double()
        return "BiasAddGrad", [list(shape)], (x.numel() + shape[-1]) * esize, fn, \
            max_rel(out, xd.sum((0, 1, 2)), xd.abs().sum((0, 1, 2)))
    if kind == "add_same":
        shape = c["shape"]
        a, b = uniform(gen, *shape).to(dt), uniform(gen, *shape).to(dt)
        out = torch.empty_like(a)
        fn = lambda: torch.add(a, b, out=out)  # noqa: E731
        fn()
        want = (a.float() + b.float()).to(dt)
        err = 0.0 if torch.equal(out, want) else float("inf")
        return "AddV2", [list(shape), list(shape)], 3.0 * a.numel() * esize, fn, err
    if kind == "maxpool_grad":
        # max_pool2d's backward kernel given the indices (what autograd runs).
        n, h, w, ch = c["shape"]
        x = uniform(gen, n, h, w, ch).to(dt).permute(0, 3, 1, 2)
        y, idx = F.max_pool2d(x, 3, 2, padding=1, return_indices=True)
        g = torch.rand(y.shape, device="cuda", generator=gen).to(dt).contiguous(
            memory_format=torch.channels_last)
        fn = lambda: torch.ops.aten.max_pool2d_with_indices_backward(  # noqa: E731
            g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx)
        dx = fn()
        want = torch.zeros_like(x, dtype=torch.float64).flatten(2)
        want.scatter_add_(2, idx.flatten(2), g.double().flatten(2))
        want = want.view(x.shape)
        scale = torch.zeros_like(want).flatten(2)
        scale.scatter_add_(2, idx.flatten(2), g.double().abs().flatten(2))
        # Bytes as for ours: every input read once (x, y, grad) and dx written once.
        return "MaxPoolGrad", [[n, h, w, ch], list(y.shape), list(y.shape)], \
            (2.0 * x.numel() + 2.0 * y.numel()) * esize, fn, max_rel(dx, want, scale.view(x.shape))
    if kind == "maxpool":
        n, h, w, ch = c["shape"]
        x = uniform(gen, n, h, w, ch).to(dt).permute(0, 3, 1, 2)
        fn = lambda: F.max_pool2d(x, 3, 2, padding=1)  # noqa: E731
        y = fn()
        want = F.max_pool2d(x.double(), 3, 2, padding=1)
        return "MaxPool", [[n, h, w, ch]], (x.numel() + y.numel()) * float(esize), fn, \
            max_rel(y, want, want)
    raise ValueError(kind)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="all")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--sizes", help="square matmuls only (the old interface)")
    ap.add_argument("--transpose", choices=["none", "a", "b", "ab"], default="none",
                    help="with --sizes: transposed operands (tfwgpu-bench matmul --torch)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="torch-ops.json")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    cases = all_cases(args.small)
    if args.list:
        print("\n".join(c["name"] for c in cases))
        return
    if args.sizes:
        ta, tb = "a" in args.transpose, "b" in args.transpose
        cases = [mm(0, s, s, s, ta, tb) for s in map(int, args.sizes.split(","))]
    elif args.cases != "all":
        want = args.cases.split(",")
        names = {c["name"] for c in cases}
        bad = [w for w in want if w not in names]
        if bad:
            raise SystemExit(f"no case(s) {bad} (--list names them)")
        membound = any(c["name"] in want and c["kind"] != "matmul" for c in cases)
        cases = [c for c in cases if c["name"] in want
                 or (membound and c["kind"] == "copy" and c["elems"] >= 1 << 20)]
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {props.name}, "
          f"{props.multi_processor_count} SMs")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gen = torch.Generator(device=dev).manual_seed(7)
    rows, copy_gbps = [], None
    print(f"{'case':<28} {'mode':>5} {'median ms':>10} {'rate':>12} {'% copy':>7} {'rel err':>8}")
    for c in cases:
        if c["kind"] == "matmul":
            new = run_matmul(c, gen, args.reps)
        else:
            try:
                op, shape, nbytes, fn, err = run_membound(c, gen, args.reps)
                med, lo, inner = time_fn(fn, args.reps)
            except (RuntimeError, TypeError) as e:  # one unsupported case must not end the run
                print(f"{c['name']:<28} failed: {e}", flush=True)
                torch.cuda.empty_cache()
                continue
            gbps = nbytes / med / 1e9
            pct = None
            same_gbps = same_pct = None
            if c["kind"] == "copy":
                copy_gbps = max(copy_gbps or 0.0, gbps)
            else:
                if copy_gbps:
                    pct = gbps / copy_gbps * 100
                # A copy_ of the case's own bytes (half read, half written), right after it:
                # what a kernel of that size reaches (tfwgpu-bench's pct_copy_same).
                cc = {"kind": "copy", "elems": max(4, int(nbytes // 8) // 4 * 4)}
                _, _, cbytes, cfn, _ = run_membound(cc, gen, args.reps)
                cmed, _, _ = time_fn(cfn, args.reps)
                same_gbps = cbytes / cmed / 1e9
                same_pct = gbps / same_gbps * 100
            half = c.get("half", False)
            new = [{"case": c["name"], "op": op, "shape": shape,
                    "dtype": "float16" if half else "float32", "mode": "f16" if half else "f32",
                    "ms": med * 1e3, "min_ms": lo * 1e3, "bytes": nbytes, "gbps": gbps,
                    "pct_copy": pct, "copy_same_gbps": same_gbps, "pct_copy_same": same_pct,
                    "rel_err": err, "inner": inner, "reps": args.reps}]
        for r in new:
            rate = f"{r['tflops']:.2f} TF/s" if "tflops" in r else f"{r['gbps']:.0f} GB/s"
            pct = f"{r['pct_copy']:.0f}%" if r.get("pct_copy") is not None else "-"
            print(f"{r['case']:<28} {r['mode']:>5} {r['ms']:>10.4f} {rate:>12} {pct:>7} {r['rel_err']:>8.1e}",
                  flush=True)
        rows += new
        torch.cuda.empty_cache()
    doc = {"tool": "torch", "torch": torch.__version__, "cuda": torch.version.cuda,
           "device": props.name, "sms": props.multi_processor_count, "copy_gbps": copy_gbps,
           "results": rows}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
