#!/usr/bin/env python3
"""A volumetric CNN's training step: Keras on tfwgpu's /GPU:0 (Conv3D, MaxPooling3D: the 3-D
kernels of session 25) and PyTorch on CUDA (cuDNN's Conv3d, float32, TF32 off), in ONE process,
blocks alternating in time (separate processes differ in host speed by up to 2x on the GPU
host), like bench/seq_interleaved.py.

Model: Conv3D(16, 3, same, relu) -> MaxPooling3D(2) -> Conv3D(32, 3, same, relu) ->
MaxPooling3D(2) -> Conv3D(64, 3, same, relu) -> GlobalAveragePooling3D -> Dense(10), on
32 x 32 x 32 x 1 volumes, batch 16, Adam(1e-3), cross-entropy; Keras `fit` on a tf.data
pipeline with the loss read each step, PyTorch's step with the batch from pageable memory and
`loss.item()`. Prints every block's ms per step, the medians and their ratio; writes JSON.

    python3 bench/vol_interleaved.py [--steps 20] [--rounds 6] [--no-torch] [--no-keras]
        [--cudnn-benchmark] [--json FILE]

`--cudnn-benchmark` adds PyTorch with `torch.backends.cudnn.benchmark = True` (cuDNN times its
algorithms on first use and keeps the fastest; off by default in PyTorch).
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

BATCH, SIZE = 16, 32


def keras_block(tf, keras, steps):
    L = keras.layers
    keras.utils.set_random_seed(1)
    with tf.device("/GPU:0"):
        m = keras.Sequential([
            keras.Input((SIZE, SIZE, SIZE, 1)),
            L.Conv3D(16, 3, padding="same", activation="relu"),
            L.MaxPooling3D(2),
            L.Conv3D(32, 3, padding="same", activation="relu"),
            L.MaxPooling3D(2),
            L.Conv3D(64, 3, padding="same", activation="relu"),
            L.GlobalAveragePooling3D(),
            L.Dense(10),
        ])
        m.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH * 4, SIZE, SIZE, SIZE, 1)).astype("float32")
    y = rng.integers(0, 10, BATCH * 4).astype("int32")
    with tf.device("/CPU:0"):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()

    def run():
        with tf.device("/GPU:0"):
            t0 = time.perf_counter()
            m.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0)
            return (time.perf_counter() - t0) / steps * 1e3

    run()
    return run


def torch_block(steps, benchmark=False):
    import torch
    from torch import nn

    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = nn.Sequential(
        nn.Conv3d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool3d(2),
        nn.Conv3d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool3d(2),
        nn.Conv3d(32, 64, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(64, 10),
    ).to(dev).train()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    hx = torch.randn((BATCH, 1, SIZE, SIZE, SIZE))
    hy = torch.randint(0, 10, (BATCH,))
    lossf = nn.CrossEntropyLoss()

    def step():
        x, y = hx.to(dev), hy.to(dev)
        opt.zero_grad(set_to_none=True)
        loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    def run():
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps * 1e3

    for _ in range(5):
        step()
    return run


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--no-keras", action="store_true")
    p.add_argument("--cudnn-benchmark", action="store_true", help="also PyTorch with cudnn.benchmark")
    p.add_argument("--json")
    a = p.parse_args(argv)
    blocks = {}
    if not a.no_keras:
        import keras
        import tensorflow as tf

        blocks["keras"] = keras_block(tf, keras, a.steps)
    if not a.no_torch:
        blocks["torch"] = torch_block(a.steps)
        if a.cudnn_benchmark:
            blocks["torch_bench"] = torch_block(a.steps, benchmark=True)
    ms = {k: [] for k in blocks}
    for r in range(a.rounds):
        for k, run in blocks.items():
            ms[k].append(run())
        print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in ms.items()), flush=True)
    med = {k: statistics.median(v) for k, v in ms.items()}
    out = {"ms_per_step": ms, "median": med}
    line = ", ".join(f"{k} {v:.3f} ms" for k, v in med.items())
    for t in ("torch", "torch_bench"):
        if "keras" in med and t in med:
            out[f"keras_over_{t}"] = med["keras"] / med[t]
            line += f"; keras / {t} {out[f'keras_over_{t}']:.2f}x"
    print(line, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
