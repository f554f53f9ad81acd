#!/usr/bin/env python3
"""The model table of issue 7: for each reference model, our step time (the kernel trace
replayed by `tfwgpu-bench replay`, and Keras end to end with the plugin when TensorFlow is
importable) against PyTorch on CUDA (float32 TF32 off / on, float16), with the ratios and the
issue's goals. Meant for the GPU host.

    python3 bench/models_table.py --bench ./tfwgpu-bench [--traces bench/traces]
        [--models mlp,cnn,resnet,resnet50] [--repeat 5] [--json table.json]
        [--torch-json F | --no-torch] [--keraslike-json F] [--keras-json F | --no-keras]
        [--keep DIR]

Sources, per model:
- replay: `<traces>/<model>.trace.gz` (written by `bench/keras_models.py --trace`, then gzipped),
  replayed `--repeat` times; the per-step figures are the median `train_step` and
  `infer_step` intervals between the trace's marks (passes after the first). GPU-busy time is
  shown when the replay's JSON reports it (per step: a `gpu_*ms` key in `steps.<label>`), else
  "-". A missing trace is marked "no trace".
- Keras: `python3 bench/keras_models.py --json ...` in a subprocess when `import tensorflow`
  works in this Python, else "not run" (or the figures of `--keras-json`).
- PyTorch: `python3 bench/torch_models.py --json ...` when torch with CUDA is importable
  (or `--torch-json`): the batch already on the GPU, no host sync inside the step, CUDA-event
  timing. And like for like with Keras (`python3 bench/torch_keraslike.py --variants
  pageable+sync,infer`, or `--keraslike-json`; not for resnet50): each training step copies
  its batch from host memory and reads the loss, as Keras `fit`'s step copies its batch and
  reads a flag; inference is N calls and one read, as keras_models.py times it.
- Inference against PyTorch in one process (`bench/infer_interleaved.py`, for the models with
  goals, when both TensorFlow and torch with CUDA are importable; `--no-interleaved` skips it):
  Keras's and PyTorch's inference calls in alternating blocks of one process, whose per-round
  ratio does not depend on the host's speed, which differs between processes by up to 2.7x on
  the H200 host (bench/RESULTS.md, session 18). The inference goal is judged on its median
  ratio when it ran (marked "(interleaved)"). Training the same way (`infer_interleaved.py
  --train`: Keras `fit` blocks against PyTorch's like-for-like steps, session 19) for the models
  with goals that have a like-for-like step (not resnet50), and the training goal on its ratio.
- GPU busy: the replay's share of each step with timestamps around each compute pass
  (`gpu_busy_pct_median_per_pass`); the per-command timestamps slow the step they time, so
  their busy time over the untimed step overstated it (over 100% in session 18's table).

Goals (issue 7, H200): training within 1.5x of PyTorch float32 (TF32 off) for cnn and
resnet50, inference within 1.3x; judged on the Keras figure against PyTorch like for like when
both are there (marked "(like)"), else against torch_models.py's float32 step, else on the
replayed figure (marked "(replay)"). mlp and resnet get ratios and no goal.
"""
import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("mlp", "cnn", "resnet", "resnet50")
GOALS = {"cnn": (1.5, 1.3), "resnet50": (1.5, 1.3)}


def sh(cmd, timeout):
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-2000:] + r.stderr[-4000:])
    return r


def gpu_ms(step):
    """A GPU-busy figure of one `steps.<label>` entry, if the replay reports one."""
    for k in ("gpu_busy_median_ms_per_pass", "gpu_busy_median_ms", "gpu_median_ms", "gpu_busy_ms",
              "gpu_ms"):
        v = step.get(k)
        if isinstance(v, (int, float)):
            return float(v)
    return None


def busy_share(step):
    """The GPU-busy share of a replayed step: timed per compute pass when the replay reports
    it (the step then runs nearly as untimed), else None."""
    v = step.get("gpu_busy_pct_median_per_pass")
    return float(v) / 100 if isinstance(v, (int, float)) else None


def replay(bench, traces, model, repeat, work, timeout):
    gz = os.path.join(traces, f"{model}.trace.gz")
    if not os.path.exists(gz):
        return {"status": "no trace", "path": gz}
    path = os.path.join(work, f"{model}.trace")
    with gzip.open(gz, "rb") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    out = os.path.join(work, f"{model}.replay.json")
    r = sh([bench, "replay", path, "--repeat", str(repeat), "--json", out], timeout)
    if r.returncode != 0:
        return {"status": f"replay failed (exit {r.returncode})", "stderr": r.stderr[-2000:]}
    doc = json.load(open(out))
    steps = doc.get("steps") or {}
    res = {"status": "ok", "adapter": doc.get("adapter"), "wall_median_ms": doc.get("wall_median_ms"),
           "dispatches": doc.get("dispatches"), "submits": doc.get("submits"),
           "host_syncs": doc.get("host_syncs"), "gpu_time_ms": doc.get("gpu_time_ms")}
    for label, key in (("train_step", "train"), ("infer_step", "infer")):
        s = steps.get(label)
        if s:
            res[f"{key}_ms"] = s["median_ms"]
            res[f"{key}_steps"] = s["steps"]
            g = gpu_ms(s)
            if g is not None:
                res[f"{key}_gpu_ms"] = g
                res[f"{key}_gpu_busy"] = busy_share(s)
    res["raw"] = {k: doc[k] for k in doc if k != "per_op"}
    return res


def have(module_check):
    r = subprocess.run([sys.executable, "-c", module_check], capture_output=True, text=True, timeout=300)
    return r.returncode == 0


def fmt(v, nd=2):
    return "-" if v is None else f"{v:.{nd}f}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", default="tfwgpu-bench", help="the tfwgpu-bench binary")
    p.add_argument("--traces", default=os.path.join(HERE, "traces"))
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--torch-json")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--torch-args", default="", help="extra arguments for torch_models.py")
    p.add_argument("--no-interleaved", action="store_true",
                   help="skip bench/infer_interleaved.py (inference and training against PyTorch in one process)")
    p.add_argument("--keraslike-json", help="bench/torch_keraslike.py's JSON instead of running it "
                   "(with --torch-json and without this, the like-for-like column is left out)")
    p.add_argument("--keras-json")
    p.add_argument("--no-keras", action="store_true")
    p.add_argument("--keras-args", default="", help="extra arguments for keras_models.py")
    p.add_argument("--keep", help="keep the gunzipped traces and replay JSON here")
    p.add_argument("--timeout", type=int, default=900, help="seconds per subprocess")
    p.add_argument("--json")
    a = p.parse_args(argv)
    models = [m for m in a.models.split(",") if m]
    work = a.keep or tempfile.mkdtemp(prefix="models-table-")
    os.makedirs(work, exist_ok=True)
    table = {"models": models, "results": {}}

    # PyTorch
    torch_doc = None
    if a.torch_json:
        torch_doc = json.load(open(a.torch_json))
    elif not a.no_torch and have("import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"):
        out = os.path.join(work, "torch.json")
        r = sh([sys.executable, os.path.join(HERE, "torch_models.py"), "--models", ",".join(models), "--json", out]
               + a.torch_args.split(), a.timeout)
        if r.returncode == 0:
            torch_doc = json.load(open(out))
            print(r.stdout)
    table["torch"] = {k: v for k, v in (torch_doc or {}).items() if k != "results"} or "not run"
    like_doc = None
    like_models = [m for m in models if m != "resnet50"]
    if a.keraslike_json:
        like_doc = json.load(open(a.keraslike_json))
    elif torch_doc is not None and like_models and not a.torch_json:
        out = os.path.join(work, "torch_keraslike.json")
        r = sh([sys.executable, os.path.join(HERE, "torch_keraslike.py"), "--models", ",".join(like_models),
                "--variants", "pageable+sync,infer", "--json", out], a.timeout)
        if r.returncode == 0:
            like_doc = json.load(open(out))
            print(r.stdout)
    like = (like_doc or {}).get("results", {})

    # Keras
    keras_doc = None
    if a.keras_json:
        keras_doc = json.load(open(a.keras_json))
    elif not a.no_keras and have("import tensorflow"):
        out = os.path.join(work, "keras.json")
        r = sh([sys.executable, os.path.join(HERE, "keras_models.py"), "--models", ",".join(models), "--json", out]
               + a.keras_args.split(), a.timeout)
        if r.returncode == 0:
            keras_doc = json.load(open(out))
            print(r.stdout)
    table["keras"] = {k: v for k, v in (keras_doc or {}).items() if k != "results"} or "not run"

    # Inference and training against PyTorch in one process
    interleaved = {"infer": {}, "train": {}}
    if (not a.no_interleaved and torch_doc is not None and not a.torch_json and keras_doc is not None
            and not a.keras_json):
        for kind in ("infer", "train"):
            for m in (m for m in models if m in GOALS and (kind == "infer" or m in like_models)):
                out = os.path.join(work, f"interleaved-{kind}-{m}.json")
                calls = "20" if m == "resnet50" else ("300" if kind == "infer" else "200")
                r = sh([sys.executable, os.path.join(HERE, "infer_interleaved.py"), "--model", m, "--calls", calls,
                        "--rounds", "8", "--json", out] + (["--train"] if kind == "train" else []), a.timeout)
                if r.returncode == 0:
                    doc = json.load(open(out))
                    interleaved[kind][m] = statistics.median(doc["ratios"])
                    print(r.stdout[-400:])
    table["interleaved"] = interleaved if any(interleaved.values()) else "not run"

    for m in models:
        row = {"replay": replay(a.bench, a.traces, m, a.repeat, work, a.timeout)}
        row["keras"] = (keras_doc or {}).get("results", {}).get(m)
        row["torch"] = (torch_doc or {}).get("results", {}).get(m)
        t32 = (row["torch"] or {}).get("f32") or {}
        for kind, variant in (("train", "pageable+sync"), ("infer", "infer")):
            ref = t32.get(f"{kind}_ms")
            ref_like = (like.get(f"{m}/{variant}") or {}).get("median")
            row[f"{kind}_torch_like_ms"] = ref_like
            ours_k = (row["keras"] or {}).get(f"{kind}_ms")
            ours_r = row["replay"].get(f"{kind}_ms")
            row[f"{kind}_ratio_keras"] = ours_k / ref if ours_k and ref else None
            row[f"{kind}_ratio_keras_like"] = ours_k / ref_like if ours_k and ref_like else None
            row[f"{kind}_ratio_replay"] = ours_r / ref if ours_r and ref else None
        for kind in ("train", "infer"):
            row[f"{kind}_ratio_interleaved"] = interleaved[kind].get(m)
        if m in GOALS:
            goal = {}
            for kind, limit in zip(("train", "infer"), GOALS[m]):
                r_l, r_k, r_r = (row[f"{kind}_ratio_keras_like"], row[f"{kind}_ratio_keras"],
                                 row[f"{kind}_ratio_replay"])
                if row[f"{kind}_ratio_interleaved"] is not None:
                    r, basis = row[f"{kind}_ratio_interleaved"], "interleaved"
                elif r_l is not None:
                    r, basis = r_l, "like"
                elif r_k is not None:
                    r, basis = r_k, "keras"
                else:
                    r, basis = r_r, "replay"
                goal[kind] = {"limit": limit, "ratio": r, "basis": basis,
                              "met": None if r is None else bool(r <= limit)}
            row["goal"] = goal
        table["results"][m] = row

    # The table
    hdr = (f"{'model':9s} {'kind':5s} {'replay':>9s} {'gpu busy':>8s} {'Keras':>9s} {'torch f32':>9s} "
           f"{'tf32':>8s} {'f16':>8s} {'like':>8s} {'Keras/f32':>9s} {'Keras/like':>10s} {'replay/f32':>10s}  goal")
    print()
    print("ms per step (median); ratios: ours / PyTorch float32 (TF32 off); batch 64; like: PyTorch's "
          "float32 step like Keras's (torch_keraslike.py: batch copied from the host and the loss read "
          "each training step)")
    print(hdr)
    print("-" * len(hdr))
    for m, row in table["results"].items():
        rp, ke, to = row["replay"], row["keras"] or {}, row["torch"] or {}
        for kind in ("train", "infer"):
            if rp.get("status") != "ok":
                rps = rp.get("status", "-")[:9]
            else:
                rps = fmt(rp.get(f"{kind}_ms"))
            busy = rp.get(f"{kind}_gpu_busy")
            ks = fmt(ke.get(f"{kind}_ms")) if ke else "not run"
            g = (row.get("goal") or {}).get(kind)
            if g is None:
                gs = "-"
            elif g["met"] is None:
                gs = f"<= {g['limit']}x: no figures"
            else:
                gs = f"<= {g['limit']}x: {'met' if g['met'] else 'NOT met'} ({g['ratio']:.2f}x" + (
                    f", {g['basis']})" if g["basis"] != "keras" else ")")
            print(f"{m:9s} {kind:5s} {rps:>9s} {('-' if busy is None else f'{busy:.0%}'):>8s} {ks:>9s} "
                  f"{fmt((to.get('f32') or {}).get(f'{kind}_ms')):>9s} {fmt((to.get('tf32') or {}).get(f'{kind}_ms')):>8s} "
                  f"{fmt((to.get('f16') or {}).get(f'{kind}_ms')):>8s} {fmt(row[f'{kind}_torch_like_ms']):>8s} "
                  f"{fmt(row[f'{kind}_ratio_keras']):>9s} {fmt(row[f'{kind}_ratio_keras_like']):>10s} "
                  f"{fmt(row[f'{kind}_ratio_replay']):>10s}  {gs}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(table, f, indent=1)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
