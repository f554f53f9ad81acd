"""Multi-GPU scaling of Keras training on tfwgpu devices: the demo's CNN (tensorflow_wgpu.demo)
trained with fit on one device and with tf.distribute.MirroredStrategy over every tfwgpu GPU,
same per-GPU batch, synthetic Fashion-MNIST-shaped data. Prints images/s and the scaling
efficiency, and writes JSON.

    python bench/mirrored.py [--per-gpu-batch 256] [--steps 60] [--json FILE]
"""
import argparse
import json
import time

import numpy as np


try:
    import tensorflow_wgpu
except ImportError:
    tensorflow_wgpu = None


def StepMarks(keras, label):
    """Marks each step's start in a TFWGPU_TRACE trace (a no-op without TFWGPU_TRACE)."""

    class Marks(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            tensorflow_wgpu.trace_mark(label)

    return Marks()


def run(tf, keras, strategy, per_gpu_batch, steps):
    from tensorflow_wgpu.demo import build_model

    n = strategy.num_replicas_in_sync
    batch = per_gpu_batch * n
    rng = np.random.default_rng(0)
    x = rng.random((batch * steps, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, batch * steps).astype("int32")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = build_model(keras)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    # Warm-up: tracing, pipelines, allocator growth.
    model.fit(x[: batch * 5], y[: batch * 5], batch_size=batch, epochs=1, verbose=0)
    marks = [StepMarks(keras, f"{n}gpu")] if tensorflow_wgpu else []
    t0 = time.perf_counter()
    h = model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=marks)
    dt = time.perf_counter() - t0
    if marks:
        tensorflow_wgpu.trace_mark("end")
    return {"replicas": n, "global_batch": batch, "images_per_s": len(x) / dt, "loss": h.history["loss"][-1]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--per-gpu-batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--json")
    a = p.parse_args()
    import keras
    import tensorflow as tf

    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    res = {"gpus": gpus}
    res["one"] = run(tf, keras, tf.distribute.OneDeviceStrategy(gpus[0]), a.per_gpu_batch, a.steps)
    if len(gpus) > 1:
        res["all"] = run(tf, keras, tf.distribute.MirroredStrategy(gpus), a.per_gpu_batch, a.steps)
        res["speedup"] = res["all"]["images_per_s"] / res["one"]["images_per_s"]
        res["efficiency"] = res["speedup"] / len(gpus)
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
