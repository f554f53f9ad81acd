#!/usr/bin/env python3
"""Keras recurrent training steps on tfwgpu's /GPU:0, through the fused recurrent op and through
Keras's generic loop (`use_cudnn=False`), and PyTorch's on CUDA (cuDNN's nn.LSTM / nn.GRU and
the per-timestep cell loops of bench/torch_seq.py), in ONE process, in blocks that alternate in
time: separate processes of one device call differ in host speed by up to 2x on the GPU host
(bench/RESULTS.md, sessions 18 and 24), so ratios are taken between blocks of one process.

Models as bench/keras_fit_reads.py's lstm / gru: LSTM(64) or GRU(64) over 20 steps of 16
features, Dense(10), Adam(1e-3), batch 64, `fit` on a tf.data pipeline with
`metrics=["accuracy"]` (the loss and metric read each step); PyTorch's step as torch_seq.py's
(batch from pageable host memory, `loss.item()` each step). A block is `--steps` steps; prints
every block's ms per step, the medians over `--rounds` rounds and their ratios; writes JSON.
lstm_masked / gru_masked: Embedding(1000, 16, mask_zero=True) on left-padded tokens (Keras's
`pad_sequences` default; lengths 1..20) into the layer; PyTorch packs right-padded tokens by
length (torch_seq.py); there is no PyTorch cell loop for them.

    python3 bench/seq_interleaved.py [--models lstm,gru] [--steps 40] [--rounds 6] [--no-torch]
        [--json FILE]
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

BATCH = 64


def keras_block_fn(tf, keras, kind, cudnn, steps):
    L = keras.layers
    keras.utils.set_random_seed(1)
    masked = kind.endswith("_masked")
    with tf.device("/GPU:0"):
        layer = {"lstm": L.LSTM, "gru": L.GRU}[kind.split("_")[0]]
        first = [keras.Input((20,), dtype="int32"), L.Embedding(1000, 16, mask_zero=True)] if masked else [keras.Input((20, 16))]
        m = keras.Sequential(first + [layer(64, use_cudnn=cudnn), L.Dense(10)])
        m.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    rng = np.random.default_rng(0)
    if masked:
        lengths = rng.integers(1, 21, BATCH * 8)
        x = rng.integers(1, 1000, (BATCH * 8, 20)).astype("int32")
        x[np.arange(20)[None, :] < 20 - lengths[:, None]] = 0
    else:
        x = rng.standard_normal((BATCH * 8, 20, 16)).astype("float32")
    y = rng.integers(0, 10, BATCH * 8).astype("int32")
    with tf.device("/CPU:0"):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()

    def run():
        with tf.device("/GPU:0"):
            t0 = time.perf_counter()
            m.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0)
            return (time.perf_counter() - t0) / steps * 1e3

    run()  # warm-up: tracing, pipelines
    return run


def torch_block_fn(name, steps):
    import torch

    import torch_seq

    step = torch_seq.make_step(name)

    def run():
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps * 1e3

    for _ in range(10):
        step()
    return run


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="lstm,gru")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--json")
    a = p.parse_args(argv)
    import keras
    import tensorflow as tf

    blocks = {}
    for kind in a.models.split(","):
        blocks[f"keras_{kind}_fused"] = keras_block_fn(tf, keras, kind, "auto", a.steps)
        blocks[f"keras_{kind}_loop"] = keras_block_fn(tf, keras, kind, False, a.steps)
        if not a.no_torch:
            blocks[f"torch_{kind}"] = torch_block_fn(kind, a.steps)
            if not kind.endswith("_masked"):
                blocks[f"torch_{kind}_loop"] = torch_block_fn(f"{kind}_loop", a.steps)
    ms = {k: [] for k in blocks}
    for r in range(a.rounds):
        for k, run in blocks.items():
            ms[k].append(run())
        print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in ms.items()), flush=True)
    med = {k: statistics.median(v) for k, v in ms.items()}
    out = {"ms_per_step": ms, "median": med, "ratios": {}}
    for kind in a.models.split(","):
        fused, loop = med[f"keras_{kind}_fused"], med[f"keras_{kind}_loop"]
        out["ratios"][f"{kind}_loop_over_fused"] = loop / fused
        line = f"{kind}: keras fused {fused:.3f} ms, keras loop {loop:.3f} ms ({loop / fused:.2f}x fused)"
        if not a.no_torch:
            t = med[f"torch_{kind}"]
            out["ratios"][f"{kind}_fused_over_torch"] = fused / t
            line += f"; torch cuDNN {t:.3f} ms (keras fused {fused / t:.2f}x)"
            if f"torch_{kind}_loop" in med:
                tl = med[f"torch_{kind}_loop"]
                out["ratios"][f"{kind}_loop_over_torch_loop"] = loop / tl
                line += f", torch cell loop {tl:.3f} ms"
        print(line, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
