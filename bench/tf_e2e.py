"""End-to-end TensorFlow figures on one machine: the same Keras programs on /GPU:0 (tfwgpu)
and /CPU:0 (TensorFlow's own kernels), side by side in one run. Synthetic data (the GPU host
has no dataset package); prints a table and writes JSON.

    python bench/tf_e2e.py [--json FILE]
"""
import argparse
import json
import time

import numpy as np


def timed_fit(tf, keras, device, build, x, y, batch, epochs):
    keras.utils.set_random_seed(0)
    with tf.device(device):
        model = build(keras)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        model.fit(x[: batch * 4], y[: batch * 4], batch_size=batch, epochs=1, verbose=0)  # warm-up, tracing
        t0 = time.perf_counter()
        h = model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0)
        train = epochs * len(x) / (time.perf_counter() - t0)
        model.predict(x[: batch * 2], batch_size=batch, verbose=0)
        t0 = time.perf_counter()
        model.predict(x, batch_size=batch, verbose=0)
        infer = len(x) / (time.perf_counter() - t0)
    return {"train_images_per_s": train, "infer_images_per_s": infer, "final_loss": h.history["loss"][-1]}


def mlp(keras):
    L = keras.layers
    return keras.Sequential([keras.Input((784,)), L.Dense(512, activation="relu"), L.Dense(512, activation="relu"), L.Dense(10, activation="softmax")])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    a = p.parse_args()
    import tensorflow as tf
    import keras
    import tensorflow_wgpu

    ad = [d for d in tensorflow_wgpu.adapters() if d["tensorflow_device"]]
    print("adapter:", ad[0]["name"] if ad else None, ad[0]["driver_info"] if ad else "")
    out = {"adapter": ad[0] if ad else None, "tensorflow": tf.__version__, "results": {}}
    # tf.matmul through TensorFlow, float32, 4096^3.
    for dev in ["/GPU:0", "/CPU:0"]:
        with tf.device(dev):
            m = tf.random.stateless_uniform([4096, 4096], seed=[1, 2])
            r = tf.matmul(m, m)
            _ = r.numpy()
            t0 = time.perf_counter()
            n = 10 if dev == "/GPU:0" else 2
            for _ in range(n):
                r = tf.matmul(m, m)
            _ = r.numpy()
            dt = (time.perf_counter() - t0) / n
        out["results"][f"matmul4096 {dev}"] = {"ms": dt * 1e3, "tflops": 2 * 4096**3 / dt / 1e12}
        print(f"tf.matmul 4096^3 on {dev}: {dt * 1e3:.2f} ms, {2 * 4096**3 / dt / 1e12:.2f} TFLOP/s")
    rng = np.random.default_rng(0)
    x = rng.random((60000, 784), dtype=np.float32)
    y = rng.integers(0, 10, 60000).astype("int32")
    for dev in ["/GPU:0", "/CPU:0"]:
        r = timed_fit(tf, keras, dev, mlp, x, y, 256, 2)
        out["results"][f"mlp {dev}"] = r
        print(f"MLP 784-512-512-10, batch 256 on {dev}: train {r['train_images_per_s']:.0f} img/s, inference {r['infer_images_per_s']:.0f} img/s, loss {r['final_loss']:.4f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
