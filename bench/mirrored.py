"""Multi-GPU scaling of Keras training on tfwgpu devices: the demo's CNN (tensorflow_wgpu.demo)
trained with fit on one device and with tf.distribute.MirroredStrategy over every tfwgpu GPU,
same per-GPU batch, synthetic Fashion-MNIST-shaped data. Prints images/s and the scaling
efficiency, and writes JSON.

Two throughputs per setting: `images_per_s` is the steady state (global batch / mean time of
the timed epoch's steps, each step timed from one on_train_batch_begin to the next; the first
`--skip` steps and the last one, which carries the epoch's end, are left out), and
`fit_images_per_s` divides the images by the whole `fit` call, which also counts fit's own
start (for MirroredStrategy, distributing the dataset and building per-replica iterators:
hundreds of ms in TensorFlow before the first step) and end. The speedup is taken on the steady
state; both are reported.

    python bench/mirrored.py [--per-gpu-batch 256] [--steps 200] [--skip 5] [--json FILE]
"""
import argparse
import json
import statistics
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


class StepTimes:
    """Host time at each step's begin (a Keras callback, built lazily to keep keras optional)."""

    def __init__(self, keras):
        times = self.times = []

        class C(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                times.append(time.perf_counter())

            def on_train_end(self, logs=None):
                times.append(time.perf_counter())

        self.callback = C()

    def steps_ms(self):
        t = self.times
        return [(b - a) * 1e3 for a, b in zip(t, t[1:])]


def run(tf, keras, strategy, per_gpu_batch, steps, skip):
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
    timer = StepTimes(keras)
    t0 = time.perf_counter()
    h = model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=marks + [timer.callback])
    dt = time.perf_counter() - t0
    if marks:
        tensorflow_wgpu.trace_mark("end")
    ms = timer.steps_ms()
    # The last interval runs from the last step's begin to the end of training: it holds the
    # epoch's end (callbacks, logs), not only a step.
    steady = ms[skip:-1]
    mean = statistics.fmean(steady)
    return {
        "replicas": n,
        "global_batch": batch,
        "images_per_s": batch / mean * 1e3,
        "step_ms_mean": mean,
        "step_ms_median": statistics.median(steady),
        "step_ms_p90": sorted(steady)[int(0.9 * (len(steady) - 1))],
        "steps_timed": len(steady),
        "fit_images_per_s": len(x) / dt,
        "fit_s": dt,
        "before_first_step_s": timer.times[0] - t0,
        "last_step_and_end_ms": ms[-1],
        "loss": h.history["loss"][-1],
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--per-gpu-batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--skip", type=int, default=5, help="steps left out at the start of the timed epoch")
    p.add_argument("--json")
    a = p.parse_args()
    import keras
    import tensorflow as tf

    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    res = {"gpus": gpus}
    res["one"] = run(tf, keras, tf.distribute.OneDeviceStrategy(gpus[0]), a.per_gpu_batch, a.steps, a.skip)
    if len(gpus) > 1:
        res["all"] = run(tf, keras, tf.distribute.MirroredStrategy(gpus), a.per_gpu_batch, a.steps, a.skip)
        res["speedup"] = res["all"]["images_per_s"] / res["one"]["images_per_s"]
        res["efficiency"] = res["speedup"] / len(gpus)
        res["fit_speedup"] = res["all"]["fit_images_per_s"] / res["one"]["fit_images_per_s"]
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
