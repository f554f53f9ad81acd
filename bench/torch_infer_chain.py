"""PyTorch's CNN inference on CUDA (float32, TF32 off), timed three ways, as references for the
replayed inference step (issue 7; `tfwgpu-bench replay bench/traces/cnn.trace.gz`):

  pipelined  N calls, then one synchronize: host time per call when the GPU runs behind
             (what Keras's inference loop and `bench/torch_keraslike.py infer` measure, and the
             replay with `--no-mark-sync`);
  synced     each call followed by `torch.cuda.synchronize()`: the round trip of one call,
             launch to the host knowing the GPU finished (what the replay's `infer_step`
             measures: every mark synchronizes);
  read       each call followed by `.cpu()` of its output (10 x 64 floats): the round trip
             with the readback.

Prints the median ms per call of each (over `--reps` runs of `--steps` calls; synced and read
are per-call medians) and writes JSON with `--json`.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_models import BATCH, INPUT, build, set_mode  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="cnn")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json")
    a = p.parse_args(argv)
    torch.manual_seed(0)
    set_mode("f32")
    dev = torch.device("cuda")
    model, _ = build(a.model)
    model = model.to(dev).eval()
    x = torch.randn((BATCH[a.model],) + INPUT[a.model], device=dev)
    res = {"pipelined": [], "synced": [], "read": []}
    with torch.inference_mode():
        for _ in range(a.warmup):
            model(x).cpu()
        torch.cuda.synchronize()
        for _ in range(a.reps):
            t0 = time.perf_counter()
            for _ in range(a.steps):
                out = model(x)
            torch.cuda.synchronize()
            res["pipelined"].append((time.perf_counter() - t0) / a.steps * 1e3)
            per = []
            for _ in range(a.steps):
                t0 = time.perf_counter()
                model(x)
                torch.cuda.synchronize()
                per.append((time.perf_counter() - t0) * 1e3)
            res["synced"].append(statistics.median(per))
            per = []
            for _ in range(a.steps):
                t0 = time.perf_counter()
                out = model(x).cpu()
                per.append((time.perf_counter() - t0) * 1e3)
            res["read"].append(statistics.median(per))
    assert torch.isfinite(out).all()
    med = {k: statistics.median(v) for k, v in res.items()}
    print(
        f"torch {a.model} infer f32: pipelined {med['pipelined']:.3f} ms/call, synced "
        f"{med['synced']:.3f}, with the read {med['read']:.3f} (medians; runs "
        + "; ".join(f"{k} " + "/".join(f"{v:.3f}" for v in vs) for k, vs in res.items())
        + ")"
    )
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "steps": a.steps, "median_ms": med, "runs_ms": res}, indent=1))


if __name__ == "__main__":
    main()
