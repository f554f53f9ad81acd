#!/usr/bin/env python3
"""One table of our kernels against PyTorch on the same GPU, with issue 6's goals.

    python3 bench/compare.py ours.json torch.json [more.json ...] [--md]

Each file is a JSON document of `tfwgpu-bench ops` / `tfwgpu-bench conv` (ours) or of
bench/torch_ref.py / bench/torch_conv.py (PyTorch: a top-level "torch" version key, or rows
with a "mode" key). Rows are {case, op, shape, dtype, ms, tflops | gbps, pct_copy, rel_err}
(older conv rows with "median_ms" / "gflops" are read too). Rows pair by case name (our
copy_<how>_<size> cases pair with PyTorch's copy_<size>; a case run with a forced
tile or an op suffix keeps its own name) and by dtype.

Columns: our time and rate, PyTorch's time in each mode (f32 = TF32 off, tf32, f16), the ratio
of speeds (PyTorch f32 time / our time: > 1 means we are faster), the issue's goal for the row
and whether it is met:
- MatMul float32 4096^3: >= 0.8x PyTorch f32; 1024^3: >= 0.6x.
- Conv2D forward and backprops (and depthwise): >= 0.5x PyTorch (cuDNN) f32.
- float16 MatMul / Conv2D (ours): >= 4x our own float32 rate on the same case.
- memory-bound kernels: >= 70% of the copy bandwidth of our run (pct_copy); "% torch copy"
  is the same rate over PyTorch's copy in its file (the hardware's reachable bandwidth), shown
  beside it because our best copy can itself fall short of PyTorch's. "% same-size copy" is
  the rate over a vec4 copy of the case's own bytes measured right after it (pct_copy_same):
  what a kernel of that size reaches at most with its dispatch cost; the goal stays judged on
  the large copy.
"""
import argparse
import json
import re
import sys


def load(path):
    """[(doc, rows, is_torch)] of a file: one document, or a dict of named documents (a
    request's bundle: {"ours-conv": {...}, "torch-conv": {...}})."""
    with open(path) as f:
        top = json.load(f)
    docs = [top] if "results" in top else [
        v for v in top.values() if isinstance(v, dict) and isinstance(v.get("results"), list)]
    out = []
    for doc in docs:
        rows = doc.get("results", [])
        is_torch = ("torch" in doc or doc.get("tool") == "torch"
                    or any("mode" in r or r.get("impl") == "torch" for r in rows))
        out.append((doc, rows, is_torch))
    return out


DTYPES = {"f32": "float32", "f16": "float16", "fp32": "float32", "fp16": "float16"}


def norm_row(r):
    """Fills the uniform keys from older row layouts."""
    r = dict(r)
    if "ms" not in r and "median_ms" in r:
        r["ms"] = r["median_ms"]
    if "tflops" not in r and r.get("gflops") is not None:
        r["tflops"] = r["gflops"] / 1e3
    if "case" not in r:
        # Old matmul rows: {m, n, k, transpose_a, transpose_b, tile}.
        if "m" in r and "k" in r:
            m, k, n = r["m"], r["k"], r["n"]
            name = f"matmul_{m}" if m == k == n else f"matmul_{m}x{k}x{n}"
            name += "_ta" if r.get("transpose_a") else ""
            name += "_tb" if r.get("transpose_b") else ""
            r["case"] = name
        else:
            r["case"] = "?"
    elif r.get("op") in ("fwd", "bwd_input", "bwd_filter") and not r["case"].endswith(r["op"]):
        # Old `tfwgpu-bench conv` rows: the case names the layer, op the pass.
        r["case"] = f"{r['case']}_{r['op']}"
    tile = r.get("tile")
    if tile and tile != "auto":
        r["case"] = f"{r['case']}[{tile}]"
    if r.get("dtype") == "tf32":  # bench/torch_conv.py names the TF32 mode in dtype
        r.setdefault("mode", "tf32")
        r["dtype"] = "float32"
    r["dtype"] = DTYPES.get(r.get("dtype", "float32"), r.get("dtype", "float32"))
    return r


def key(case):
    """The pairing key: our copies pair with PyTorch's copy, forced tiles with the case."""
    return re.sub(r"\[[^\]]*\]$", "", re.sub(r"^copy_[a-z0-9]+_(?=\d)", "copy_", case))


def is_conv(r):
    op = str(r.get("op", "")).lower()
    return "conv" in op or op in ("fwd", "bwd_input", "bwd_filter") or r["case"].startswith(("conv", "dw"))


def is_matmul(r):
    return str(r.get("op", "")) in ("MatMul", "BatchMatMulV2") or r["case"].startswith(("matmul", "bmm"))


def gb(x):
    return "-" if x is None else f"{x:.0f} GB/s"


def fmt_ms(x):
    return "-" if x is None else f"{x:.4f}" if x < 1 else f"{x:.3f}"


def goal_of(r, ours_by_key, ratio_f32):
    """(goal text, met: True/False/None) for one of our rows."""
    case, dtype = r["case"], r["dtype"]
    if r.get("gbps") is not None and not case.startswith("copy"):
        pct = r.get("pct_copy")
        return ">=70% copy", None if pct is None else pct >= 70
    if dtype == "float16" and (is_matmul(r) or is_conv(r)):
        f32 = ours_by_key.get((key(case), "float32"))
        if f32 is None or not f32.get("ms") or not r.get("ms"):
            return ">=4x our f32", None
        return ">=4x our f32", f32["ms"] / r["ms"] >= 4
    if dtype != "float32":
        return "", None
    if is_matmul(r) and r.get("op") == "MatMul":
        if key(case) == "matmul_4096":
            return ">=0.8x torch f32", None if ratio_f32 is None else ratio_f32 >= 0.8
        if key(case) == "matmul_1024":
            return ">=0.6x torch f32", None if ratio_f32 is None else ratio_f32 >= 0.6
    if is_conv(r):
        return ">=0.5x torch f32", None if ratio_f32 is None else ratio_f32 >= 0.5
    return "", None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--md", action="store_true", help="a Markdown table")
    args = ap.parse_args()
    ours, torch_rows, headers = [], {}, []
    torch_copy = None
    for p, doc, rows, is_torch in ((p, *d) for p in args.files for d in load(p)):
        rows = [norm_row(r) for r in rows]
        if is_torch:
            headers.append(f"PyTorch: {p}: torch {doc.get('torch')}, CUDA {doc.get('cuda')}, "
                           f"{doc.get('device')}, copy {gb(doc.get('copy_gbps'))}")
            torch_copy = doc.get("copy_gbps") or torch_copy
            for r in rows:
                mode = r.get("mode") or ("tf32" if r.get("tf32") else
                                         "f16" if r["dtype"] == "float16" else "f32")
                torch_rows[(key(r["case"]), mode)] = r
        else:
            headers.append(f"ours: {p}: {doc.get('adapter')} ({doc.get('backend')}, driver "
                           f"{doc.get('driver')}), copy {gb(doc.get('copy_gbps'))}")
            ours += rows
    ours_by_key = {(key(r["case"]), r["dtype"]): r for r in ours}
    cols = ["case", "dtype", "ours ms", "ours rate", "% copy", "% same-size copy", "% torch copy",
            "torch % same-size", "torch f32 ms",
            "tf32 ms", "f16 ms", "ratio", "goal", "met"]
    table = []
    met_count = [0, 0]
    for r in ours:
        k = key(r["case"])
        t = {m: torch_rows.get((k, m)) for m in ("f32", "tf32", "f16")}
        # A float16 row of ours compares with PyTorch's f16 mode, a float32 one with f32.
        ref = t["f16"] if r["dtype"] == "float16" else t["f32"]
        ratio = ref["ms"] / r["ms"] if ref and ref.get("ms") and r.get("ms") else None
        goal, met = goal_of(r, ours_by_key, ratio)
        if met is not None:
            met_count[0 if met else 1] += 1
        rate = (f"{r['tflops']:.2f} TF/s" if r.get("tflops") is not None else
                f"{r['gbps']:.0f} GB/s" if r.get("gbps") is not None else "-")
        pct = r.get("pct_copy")
        table.append([
            r["case"], r["dtype"].replace("float", "f"), fmt_ms(r.get("ms")), rate,
            "-" if pct is None else f"{pct:.0f}%",
            "-" if r.get("pct_copy_same") is None else f"{r['pct_copy_same']:.0f}%",
            "-" if r.get("gbps") is None or not torch_copy else f"{100 * r['gbps'] / torch_copy:.0f}%",
            "-" if not ref or ref.get("pct_copy_same") is None else f"{ref['pct_copy_same']:.0f}%",
            *(fmt_ms(t[m]["ms"]) if t[m] else "-" for m in ("f32", "tf32", "f16")),
            "-" if ratio is None else f"{ratio:.2f}x", goal,
            "" if met is None else ("yes" if met else "NO"),
        ])
    for h in headers:
        print(h)
    if args.md:
        print("| " + " | ".join(cols) + " |")
        print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(cols))) + "|")
        for row in table:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(c), *(len(row[i]) for row in table)) if table else len(c)
                  for i, c in enumerate(cols)]
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cols, widths))))
        for row in table:
            print("  ".join(v.ljust(w) if i < 2 else v.rjust(w)
                            for i, (v, w) in enumerate(zip(row, widths))))
    print(f"goals met: {met_count[0]}, not met: {met_count[1]} "
          "(ratio = PyTorch time / our time, PyTorch f32 = TF32 off)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
