#!/usr/bin/env python3
"""PyTorch's training step made like Keras `fit`'s, to compare like for like (issue 7).

    python3 bench/torch_keraslike.py [--models cnn,mlp,resnet] [--steps 200] [--warmup 20] [--json F]

bench/torch_models.py times PyTorch's step with CUDA events, the batch already on the GPU and
no host sync inside the loop: the GPU runs behind the host, so a host-bound step is measured
at its launch rate. Keras `fit` (bench/keras_models.py) does more per step: it copies the
batch from host memory to the device (a tf.data pipeline on the host), and it waits for the
device every step (`Optional.has_value()` is read on the host by the loop, which synchronizes
the device; the batch-end callbacks read the loss). This script times, by wall clock over
`--steps` steps after `--warmup` (float32, TF32 off, the models of torch_models.py):

  device:        the batch on the GPU, no sync in the loop (torch_models.py's step; one
                 synchronize at the end of the window)
  pageable:      each step copies the batch from pageable host memory (.to(cuda))
  pageable+sync: each step copies the batch and reads the loss (`loss.item()`: a host sync),
                 as Keras fit's step does
  infer:         inference as bench/keras_models.py times it (the model in eval mode under
                 torch.inference_mode on a batch on the GPU, `--steps` calls, then one read of
                 the last output: wall / steps)
"""
import argparse
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch_models as tm  # noqa: E402


def make_step(name, variant, dev="cuda"):
    """The model of torch_models.py (float32) and a training step of `variant` (device,
    pageable, pageable+sync) for it; or, for `infer`, (model in eval mode, the batch on the
    device). Returns (step or None, model, x on the device)."""
    torch.manual_seed(0)
    dev = torch.device(dev)
    tm.set_mode("f32")
    model, make_opt = tm.build(name)
    model = model.to(dev)
    opt = make_opt(model.parameters())
    b = tm.BATCH[name]
    hx = torch.rand((b,) + tm.INPUT[name])
    hy = torch.randint(0, tm.CLASSES[name], (b,))
    x, y = hx.to(dev), hy.to(dev)
    probs = model.probs
    if variant == "infer":
        return None, model, x
    model.train()

    def step():
        xb, yb = (x, y) if variant == "device" else (hx.to(dev), hy.to(dev))
        opt.zero_grad(set_to_none=True)
        loss = tm.loss_fn(model(xb), yb, probs)
        loss.backward()
        opt.step()
        if variant == "pageable+sync":
            loss.item()

    return step, model, x


def run(name, variant, steps, warmup, reps):
    step, model, x = make_step(name, variant)
    if step is None:
        return _infer(model, x, steps, warmup, reps)
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / steps * 1e3)
    return out


def _infer(model, x, steps, warmup, reps):
    model.eval()
    with torch.inference_mode():
        for _ in range(warmup):
            out = model(x)
        out.cpu()
        res = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(steps):
                out = model(x)
            out.cpu()
            res.append((time.perf_counter() - t0) / steps * 1e3)
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="cnn")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--variants", default="device,pageable,pageable+sync,infer")
    p.add_argument("--json")
    a = p.parse_args(argv)
    res = {}
    for name in a.models.split(","):
        for variant in a.variants.split(","):
            ms = run(name, variant, a.steps, a.warmup, a.reps)
            res[f"{name}/{variant}"] = {"ms_per_step": ms, "median": statistics.median(ms)}
            what = "infer" if variant == "infer" else "train"
            print(f"{name:7s} {variant:14s} {what} {statistics.median(ms):7.3f} ms/step (wall; runs "
                  + ", ".join(f"{v:.3f}" for v in ms) + ")", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "results": res}, f, indent=1)


if __name__ == "__main__":
    main()
