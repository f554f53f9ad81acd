#!/usr/bin/env python3
"""Keras `fit` as users write it, timed per step with the plugin's reads of the GPU per step:
`model.compile(..., metrics=["accuracy"])` and a `tf.data` pipeline on the host whose
`.batch(64)` leaves the batch size unknown to the graph (as every dataset without
`drop_remainder` does), so that shape arithmetic (batch norm's counts, pooling gradients) is
computed at run time. A read of the GPU waits for every command before it: beyond the loss and
metric that Keras reads after each step, a read inside the step stops the host until the GPU
has caught up.

    python bench/keras_fit_reads.py [--models cnn,resnet,embed,mha,causal,upsample,lstm,gru,bilstm,stack,resnet50]
                                    [--steps 60] [--warmup 10] [--device /GPU:0] [--json FILE]

Models: `tensorflow_wgpu.models` cnn and resnet (their own optimizers); resnet50:
keras.applications.ResNet50 (weights None, 224 x 224 x 3, 10 classes, SGD with momentum;
only when named); embed: Embedding(1000, 32) of 40 tokens, GlobalAveragePooling1D, Dense(64,
relu), Dense(10); mha: MultiHeadAttention(4 heads of 16) over 32 steps of 64 features, a
residual, LayerNormalization, GlobalAveragePooling1D, Dense(10) (only when named); causal: a
transformer block over 32 tokens (Embedding(1000, 64), causal MultiHeadAttention(4, 16),
residuals, LayerNormalization, a gelu feed-forward of 128, GlobalAveragePooling1D, Dense(10);
only when named); upsample: strided Conv2Ds down to 8 x 8, bilinear UpSampling2D, Conv2D,
Resizing(32, 32), Conv2D, GlobalAveragePooling2D, Dense(10) over 32 x 32 x 3 images (only when
named); LSTM(64) /
GRU(64) over sequences of 20 steps of 16 features, then Dense(10); bilstm: Bidirectional(LSTM(64))
and stack: LSTM(64, return_sequences) then GRU(64) over the same sequences (only when named);
all with Adam. Keras's LSTM and GRU take the plugin's fused recurrent op; TFWGPU_FUSED_RNN=0
keeps their generic loop.
Synthetic data (uniform images, ResNet-50's too; normal sequences; uniform labels), one process
for all models. Per model: wall ms per step of a `fit` of `--steps` steps after a warm-up `fit`
of `--warmup` steps, and per step the plugin's device-to-host copies, reads of the GPU, kernel
runs and submits.
"""
import argparse
import json
import sys
import time

import numpy as np

BATCH = 64


def build(keras, name):
    L = keras.layers
    if name in ("cnn", "resnet"):
        from tensorflow_wgpu import models

        model, opt, logits = models.build(keras, name)
        return model, opt, logits, (28, 28, 1)
    if name == "resnet50":
        model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=10)
        return model, keras.optimizers.SGD(0.01, momentum=0.9), False, (224, 224, 3)
    if name == "mha":
        i = keras.Input((32, 64))
        h = L.MultiHeadAttention(4, 16)(i, i)
        o = L.Dense(10)(L.GlobalAveragePooling1D()(L.LayerNormalization()(h + i)))
        return keras.Model(i, o), keras.optimizers.Adam(1e-3), True, (32, 64)
    if name == "causal":
        i = keras.Input((32,), dtype="int32")
        e = L.Embedding(1000, 64)(i)
        h = L.LayerNormalization()(e + L.MultiHeadAttention(4, 16)(e, e, use_causal_mask=True))
        f = L.Dense(64)(L.Dense(128, activation="gelu")(h))
        h = L.LayerNormalization()(h + f)
        o = L.Dense(10)(L.GlobalAveragePooling1D()(h))
        return keras.Model(i, o), keras.optimizers.Adam(1e-3), True, (32,)
    if name == "upsample":
        model = keras.Sequential(
            [keras.Input((32, 32, 3)),
             L.Conv2D(16, 3, strides=2, padding="same", activation="relu"),
             L.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
             L.UpSampling2D(interpolation="bilinear"),
             L.Conv2D(16, 3, padding="same", activation="relu"),
             L.Resizing(32, 32),
             L.Conv2D(8, 3, padding="same"),
             L.GlobalAveragePooling2D(), L.Dense(10)]
        )
        return model, keras.optimizers.Adam(1e-3), True, (32, 32, 3)
    if name == "embed":
        model = keras.Sequential(
            [keras.Input((40,), dtype="int32"), L.Embedding(1000, 32),
             L.GlobalAveragePooling1D(), L.Dense(64, activation="relu"), L.Dense(10)]
        )
        return model, keras.optimizers.Adam(1e-3), True, (40,)
    if name == "bilstm":
        model = keras.Sequential([keras.Input((20, 16)), L.Bidirectional(L.LSTM(64)), L.Dense(10)])
        return model, keras.optimizers.Adam(1e-3), True, (20, 16)
    if name == "stack":
        model = keras.Sequential(
            [keras.Input((20, 16)), L.LSTM(64, return_sequences=True), L.GRU(64), L.Dense(10)]
        )
        return model, keras.optimizers.Adam(1e-3), True, (20, 16)
    layer = {"lstm": L.LSTM, "gru": L.GRU}[name]
    model = keras.Sequential([keras.Input((20, 16)), layer(64), L.Dense(10)])
    return model, keras.optimizers.Adam(1e-3), True, (20, 16)


def counts(tensorflow_wgpu):
    s = tensorflow_wgpu.stats()
    rt = s["runtime"]
    return {
        "d2h": s["device_to_host"]["copies"],
        "reads": rt["reads"],
        "kernels": sum(s["gpu_ops"].values()),
        "submits": rt["submits"],
    }


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="cnn,resnet,embed,lstm,gru")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--device", default="/GPU:0")
    p.add_argument("--json")
    a = p.parse_args(argv)
    import keras
    import tensorflow as tf
    import tensorflow_wgpu

    rng = np.random.default_rng(0)
    out = {}
    for name in a.models.split(","):
        keras.utils.set_random_seed(1)
        try:
            with tf.device(a.device):
                model, opt, logits, shape = build(keras, name)
                model.compile(
                    optimizer=opt,
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=logits),
                    metrics=["accuracy"],
                )
                # Distinct batches for the small models; four for ResNet-50 (its inputs are
                # large), served again by the repeat.
                n = BATCH * (4 if name == "resnet50" else max(a.steps, a.warmup))
                if name in ("embed", "causal"):
                    x = rng.integers(0, 1000, (n,) + shape).astype("int32")
                elif len(shape) == 3:
                    x = rng.random((n,) + shape, dtype=np.float32)
                else:
                    x = rng.standard_normal((n,) + shape, dtype=np.float32)
                y = rng.integers(0, 10, n).astype("int32")
                with tf.device("/CPU:0"):
                    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()
                model.fit(ds, steps_per_epoch=a.warmup, epochs=1, verbose=0)
                c0 = counts(tensorflow_wgpu)
                t0 = time.perf_counter()
                h = model.fit(ds, steps_per_epoch=a.steps, epochs=1, verbose=0)
                wall = time.perf_counter() - t0
                c1 = counts(tensorflow_wgpu)
            r = {"ms_per_step": 1e3 * wall / a.steps, "loss": float(h.history["loss"][-1])}
            r.update({f"{k}_per_step": (c1[k] - c0[k]) / a.steps for k in c0})
        except Exception as e:  # a model that fails is reported, the others still run
            r = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        out[name] = r
        print(name, json.dumps(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
