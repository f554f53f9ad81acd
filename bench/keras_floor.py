#!/usr/bin/env python3
"""TensorFlow's and Keras's own cost per step, with next to no device work (issue 7).

    python3 bench/keras_floor.py [--devices /GPU:0,/CPU:0] [--steps 300] [--batch 64] [--json F]

What a Keras `fit` step and a `tf.function` call cost before any kernel of consequence runs,
on each device, timed as bench/keras_models.py times the CNN (wall clock over `--steps` steps
after a warm-up, the data on the host as a repeated `tf.data` batch):

  fit_dense1:  `model.fit` of Dense(1) on a (batch, 1) input, SGD, mean squared error,
               `jit_compile=False` (what tensorflow_wgpu's hook picks on our device; set on both
               devices so that the CPU does not compile with XLA): the same
               per-step machinery as the CNN's step (the iterator, the train function, the
               optimizer's update and iteration counter, the loss metric, `has_value()`, the
               callbacks' loss read), with a handful of one-element kernels.
  call_identity: a `tf.function` returning its (device) input, called `--steps` times, one read
               at the end: the floor of an inference call.
  call_dense1: the same Dense(1) model called under `tf.function` (inference), one read at the end.

The CNN's step minus fit_dense1 on the same device is what the CNN's own kernels and their
executor nodes add; fit_dense1 itself is a floor no plugin can go under without changing
TensorFlow or Keras.
"""
import argparse
import json
import resource
import time

import numpy as np


def measure(tf, keras, device, steps, batch):
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).standard_normal((batch, 1)).astype(np.float32)
    y = (2.0 * x + 1.0).astype(np.float32)
    with tf.device("/CPU:0"):
        ds = tf.data.Dataset.from_tensors((x, y)).repeat()
    out = {}
    with tf.device(device):
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", jit_compile=False)
        model.fit(ds, steps_per_epoch=20, epochs=1, verbose=0)
        # With TFWGPU_HOST_LOG set (our device): the timed fit between two marks.
        from keras_models import host_log

        host_log("reset")
        host_log("mark", "train_begin")
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0)
        out["fit_dense1_ms"] = (time.perf_counter() - t0) / steps * 1e3
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        # The process's CPU time (every thread: TensorFlow's, ours, a software adapter's) and
        # its threads' context switches per step: on a machine whose cores are shared, steadier
        # than the wall time, and the switches count the thread hand-offs of a step.
        out["fit_cpu_ms"] = ((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)) / steps * 1e3
        out["fit_vcsw"] = (r1.ru_nvcsw - r0.ru_nvcsw) / steps
        out["fit_ivcsw"] = (r1.ru_nivcsw - r0.ru_nivcsw) / steps
        host_log("mark", "train_end")

        xd = tf.identity(tf.constant(x))

        @tf.function
        def ident(v):
            return v

        @tf.function
        def infer(v):
            return model(v, training=False)

        for name, fn in (("call_identity_ms", ident), ("call_dense1_ms", infer)):
            for _ in range(20):
                r = fn(xd)
            r.numpy()
            t0 = time.perf_counter()
            for _ in range(steps):
                r = fn(xd)
            r.numpy()
            out[name] = (time.perf_counter() - t0) / steps * 1e3
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default="/GPU:0,/CPU:0")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    import tensorflow as tf
    import keras

    res = {"tensorflow": tf.__version__, "keras": keras.__version__, "batch": a.batch, "steps": a.steps, "devices": {}}
    for dev in a.devices.split(","):
        r = measure(tf, keras, dev, a.steps, a.batch)
        res["devices"][dev] = r
        print(f"{dev}: fit Dense(1) {r['fit_dense1_ms']:.3f} ms/step (CPU {r['fit_cpu_ms']:.3f} ms, "
              f"{r['fit_vcsw']:.1f} + {r['fit_ivcsw']:.1f} context switches), tf.function identity {r['call_identity_ms']:.3f} ms/call, "
              f"Dense(1) inference {r['call_dense1_ms']:.3f} ms/call", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
