#!/usr/bin/env python3
"""Keras inference on tfwgpu's /GPU:0 and PyTorch's on CUDA (the CNN by default, `--model`), in ONE process, in blocks that
alternate in time, with the GPU's SM clock sampled through each block (issue 7's inference goal:
within 1.3x of PyTorch float32). Separate processes of one device call differed in host speed
by up to 2.7x, and blocks of one process in Keras inference time by 2x (bench/RESULTS.md, session
18); interleaving puts both frameworks on the same host and the same stretch of the GPU's clock.

A block is `--calls` calls of the model on a batch already on the device, then one read of the
last output (Keras: the tf.function of bench/keras_models.py; PyTorch: torch_models.py's CNN in
eval mode under inference_mode, as bench/torch_keraslike.py `infer`): wall ms per call. The
clock comes from `nvidia-smi --query-gpu=clocks.sm -lms 20` run beside the blocks (median of the
samples inside each block). Prints every block and the medians, and writes JSON.

`--train`: training instead (issue 7's training goal, within 1.5x): a Keras block is one
`model.fit` epoch of `--calls` steps on the tf.data pipeline of keras_models.py (the batch
copied from host memory each step, the loss read by the loop), a PyTorch block `--calls` steps
of bench/torch_keraslike.py's `pageable+sync` step (the same: batch from pageable host memory,
`loss.item()` each step) and, as a second reference, its `device` step (batch on the GPU, no
sync inside the block); ms per step.

    python3 bench/infer_interleaved.py [--model cnn|mlp|resnet|resnet50] [--calls 300] [--rounds 12]
        [--train] [--identity] [--json FILE]
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def clock_sampler(gpu):
    """Starts `nvidia-smi` printing GPU `gpu`'s SM clock every 20 ms; a thread stamps each
    line with the host's clock as it arrives. Returns the process (None without nvidia-smi),
    the thread and the list of (epoch seconds, MHz) it fills."""
    import shutil
    import threading

    if shutil.which("nvidia-smi") is None:
        return None, None, []
    samples = []
    proc = subprocess.Popen(
        ["nvidia-smi", "-i", str(gpu), "--query-gpu=clocks.sm", "--format=csv,noheader,nounits",
         "-lms", "20"],
        stdout=subprocess.PIPE, text=True)

    def read():
        for line in proc.stdout:
            try:
                samples.append((time.time(), float(line.strip().split(",")[0])))
            except ValueError:
                pass

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return proc, t, samples


def block(fn, calls):
    t0 = time.time()
    p0 = time.perf_counter()
    out = None
    for _ in range(calls):
        out = fn()
    return out, t0, p0


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="cnn")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--torch-device", default="cuda")
    p.add_argument("--gpu", type=int, default=0, help="the GPU whose clock nvidia-smi samples")
    p.add_argument("--train", action="store_true", help="training steps instead of inference calls")
    p.add_argument("--identity", action="store_true",
                   help="inference: also blocks of an identity tf.function on the same input (TensorFlow's per-call floor)")
    p.add_argument("--json")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.calls < 1:
        raise SystemExit("--rounds and --calls must be at least 1")
    import keras
    import tensorflow as tf
    import torch

    import keras_models
    import torch_keraslike

    model, ds, xd, infer = keras_models.prepare(tf, keras, a.model, "/GPU:0", keras_models.BATCH)

    def keras_block():
        with tf.device("/GPU:0"):
            if a.train:
                t0, p0 = time.time(), time.perf_counter()
                model.fit(ds, steps_per_epoch=a.calls, epochs=1, verbose=0, shuffle=False)
            else:
                out, t0, p0 = block(lambda: infer(xd), a.calls)
                out.numpy()
        return t0, (time.perf_counter() - p0) / a.calls * 1e3

    def torch_train_block(step):
        def run():
            out, t0, p0 = block(step, a.calls)
            if a.torch_device.startswith("cuda"):
                torch.cuda.synchronize()
            return t0, (time.perf_counter() - p0) / a.calls * 1e3
        return run

    if a.train:
        like, _, _ = torch_keraslike.make_step(a.model, "pageable+sync", a.torch_device)
        dev_step, _, _ = torch_keraslike.make_step(a.model, "device", a.torch_device)
        refs = [("torch", torch_train_block(like)), ("torch_device", torch_train_block(dev_step))]
    else:
        _, tmodel, tx = torch_keraslike.make_step(a.model, "infer", a.torch_device)
        tmodel.eval()

        def torch_block():
            with torch.inference_mode():
                out, t0, p0 = block(lambda: tmodel(tx), a.calls)
                out.cpu()
            return t0, (time.perf_counter() - p0) / a.calls * 1e3

        refs = [("torch", torch_block)]
    who = [("keras", keras_block)] + refs
    if a.identity and not a.train:
        # TensorFlow's own floor for a tf.function call on this device: the same input, no kernel.
        @tf.function
        def ident(v):
            return tf.identity(v)

        def ident_block():
            with tf.device("/GPU:0"):
                out, t0, p0 = block(lambda: ident(xd), a.calls)
                out.numpy()
            return t0, (time.perf_counter() - p0) / a.calls * 1e3

        who.insert(1, ("keras_identity", ident_block))
    for _ in range(2):  # warm-up: tracing, pipelines, cuDNN's choice
        for _, fn in who:
            fn()
    proc, reader, samples = clock_sampler(a.gpu)
    time.sleep(0.3)
    blocks = []
    for r in range(a.rounds):
        order = who[r % len(who):] + who[:r % len(who)]
        if (r // len(who)) % 2:
            order.reverse()
        for name, fn in order:
            t0, per = fn()
            blocks.append({"round": r, "who": name, "t0": t0, "t1": time.time(), "ms_per_call": per})
    time.sleep(0.1)
    if proc:
        proc.terminate()
        proc.wait()
        reader.join()
    for b in blocks:
        inside = [mhz for t, mhz in samples if b["t0"] <= t <= b["t1"]]
        b["sm_mhz_median"] = statistics.median(inside) if inside else None
        b["sm_mhz_min"] = min(inside) if inside else None
        b["clock_samples"] = len(inside)
        print(f"round {b['round']:2d} {b['who']:14s} {b['ms_per_call']:.3f} ms/call, SM clock median "
              f"{b['sm_mhz_median']} MHz (min {b['sm_mhz_min']}, {len(inside)} samples)", flush=True)
    med = {w: statistics.median(b["ms_per_call"] for b in blocks if b["who"] == w) for w, _ in who}

    def ms(r, w):
        return next(b["ms_per_call"] for b in blocks if b["round"] == r and b["who"] == w)

    all_ratios = {ref: [ms(r, "keras") / ms(r, ref) for r in range(a.rounds)] for ref, _ in refs}
    unit = "ms/step" if a.train else "ms/call"
    print("medians: " + ", ".join(f"{w} {med[w]:.3f} {unit}" for w, _ in who))
    for ref, ratios in all_ratios.items():
        print(f"keras/{ref} per round: median {statistics.median(ratios):.2f}x "
              f"({', '.join(f'{x:.2f}' for x in ratios)})")
    if any(w == "keras_identity" for w, _ in who):
        ir = [ms(r, "keras_identity") / ms(r, "torch") for r in range(a.rounds)]
        print(f"keras_identity/torch per round: median {statistics.median(ir):.2f}x "
              f"({', '.join(f'{x:.2f}' for x in ir)})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "calls": a.calls, "train": a.train, "blocks": blocks,
                       "medians": med, "ratios": all_ratios["torch"], "ratios_by_ref": all_ratios,
                       "clock_samples": samples}, f, indent=1)


if __name__ == "__main__":
    main()
