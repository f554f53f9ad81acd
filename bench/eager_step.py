#!/usr/bin/env python3
"""The eager part of a Keras `fit` step, call by call (issue 7, `TFWGPU_EAGER_OPS_DIRECT`).

    python3 bench/eager_step.py [--device /GPU:0] [--calls 200]

Builds `keras_floor.py`'s Dense(1) model, takes Keras's train function (`multi_step_on_iterator`,
from `model.train_function`'s closure) and times, `--calls` times each after 5 warm-up calls, in
us per call: the function on the iterator, `opt.has_value()`, `bool(opt.has_value())` (what
Keras's loop checks), `opt.get_value()`, and the four together with the loss's read (a step's
eager part as `fit` runs it; the loss read alone is cached by TensorFlow after its first read,
so only the step loop pays it). Where each result lives is printed too (`backing_device`).
"""
import argparse
import time

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="/GPU:0")
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args(argv)
    import keras
    import tensorflow as tf

    x = np.random.default_rng(0).standard_normal((64, 1)).astype(np.float32)
    y = 2 * x + 1
    with tf.device("/CPU:0"):
        ds = tf.data.Dataset.from_tensors((x, y)).repeat()
        it = iter(ds)
    with tf.device(a.device):
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", jit_compile=False)
        model.fit(ds, steps_per_epoch=3, epochs=1, verbose=0)
        fn = [c.cell_contents for c in model.train_function.__closure__
              if hasattr(c.cell_contents, "get_concrete_function")][0]
        opt = fn(it)
        hv = opt.has_value()
        print(f"{a.device}: optional on {opt._variant_tensor.device}, has_value backed by "
              f"{hv.backing_device}, loss backed by {opt.get_value()['loss'].backing_device}")

        def timed(f):
            for _ in range(5):
                f()
            t0 = time.perf_counter()
            for _ in range(a.calls):
                f()
            return (time.perf_counter() - t0) / a.calls * 1e6

        def step():
            o = fn(it)
            assert bool(o.has_value())
            float(o.get_value()["loss"])

        for name, f in (("function", lambda: fn(it)), ("has_value", lambda: opt.has_value()),
                        ("bool(has_value)", lambda: bool(opt.has_value())),
                        ("get_value", lambda: opt.get_value()), ("step (all + loss read)", step)):
            print(f"  {name:24s} {timed(f):9.1f} us/call", flush=True)


if __name__ == "__main__":
    main()
