"""The tfwgpu demo: a Keras CNN trained on the real Fashion-MNIST on the best GPU adapter
tfwgpu finds, with Keras's own progress bar; then test accuracy, images per second for
training and inference, and (through `python -m tensorflow_wgpu.report`) where each op ran.

    python -m tensorflow_wgpu.demo [--epochs N] [--batch-size N] [--limit N] [--device D]
                                   [--compare-cpu] [--data-dir DIR]

Training images per second count the whole `fit`, its first epoch included (tracing, and on
the GPU the shader compiles and kernel tuning of first use). Inference is timed on a second
pass of `evaluate` over the test set, after a first pass that pays those costs for the
evaluation's own batch shapes, on either device.

Defaults fit the adapter: on a hardware GPU the full 60,000 training images for 15 epochs; on a
software adapter (Mesa lavapipe, which runs shaders on the CPU) 6,000 images for 2 epochs,
which finishes in a few minutes on 2 cores.
"""
import argparse
import os
import sys
import time


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m tensorflow_wgpu.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--limit", type=int, help="train on the first N images")
    p.add_argument("--device", default="/GPU:0", help="TensorFlow device to train on (default /GPU:0)")
    p.add_argument("--compare-cpu", action="store_true", help="train the same model on /CPU:0 too")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args(argv)


def build_model(keras):
    """A two-conv CNN in the spirit of TensorFlow's Fashion-MNIST tutorial model."""
    L = keras.layers
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            L.Conv2D(32, 3, activation="relu"),
            L.MaxPooling2D(),
            L.Conv2D(64, 3, activation="relu"),
            L.MaxPooling2D(),
            L.Flatten(),
            L.Dropout(0.25),
            L.Dense(128, activation="relu"),
            L.Dense(10, activation="softmax"),
        ]
    )


def train(tf, keras, device, data, epochs, batch_size, seed, callbacks=None, verbose=1):
    (x, y), (xt, yt) = data
    keras.utils.set_random_seed(seed)
    # The input pipeline lives on the host, as in TensorFlow's own input-pipeline guide: Keras
    # would otherwise copy the whole training array to the device at once (188 MB here, more
    # than a software adapter such as lavapipe can bind in one buffer) and slice batches there.
    with tf.device("/CPU:0"):
        train_ds = (
            tf.data.Dataset.from_tensor_slices((x, y))
            .shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
            .batch(batch_size)
            .prefetch(2)
        )
        test_ds = tf.data.Dataset.from_tensor_slices((xt, yt)).batch(512)
    with tf.device(device):
        model = build_model(keras)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        t0 = time.perf_counter()
        model.fit(train_ds, epochs=epochs, verbose=verbose, shuffle=False, callbacks=callbacks)  # shuffled
        train_s = time.perf_counter() - t0
        model.evaluate(test_ds, verbose=0)  # first use of the evaluation's shapes
        t0 = time.perf_counter()
        _, acc = model.evaluate(test_ds, verbose=0)
        infer_s = time.perf_counter() - t0
    return {
        "accuracy": float(acc),
        "train_images_per_s": epochs * len(x) / train_s,
        "infer_images_per_s": len(xt) / infer_s,
    }


def main(argv=None):
    a = _parse(argv)
    from tensorflow_wgpu import fashion_mnist

    try:
        kwargs = {"directory": a.data_dir} if a.data_dir else {}
        (x, y), (xt, yt) = fashion_mnist.load(**kwargs)
    except (fashion_mnist.MissingDataset, ValueError) as e:
        print(f"demo: {e}", file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError:
        print("demo: TensorFlow is not installed: pip install tensorflow-cpu==2.21.0", file=sys.stderr)
        return 2
    import keras
    import tensorflow_wgpu

    if a.device.upper().startswith("/GPU"):
        opened = [d for d in tensorflow_wgpu.adapters() if d["tensorflow_device"]]
        if not opened or not tf.config.list_physical_devices("GPU"):
            print(
                "demo: no tfwgpu GPU is available (see the warning above). Install a GPU driver, "
                "or Mesa's lavapipe (apt-get install mesa-vulkan-drivers), or pass --device /CPU:0",
                file=sys.stderr,
            )
            return 3
        ad = opened[0]
        print(f"adapter: {ad['name']} ({ad['backend']}, {ad['device_type']}, driver {ad['driver']} {ad['driver_info']})")
        software = ad["device_type"] == "cpu"
    else:
        print(f"device: {a.device}")
        software = False
    limit = a.limit or (6000 if software else len(x))
    epochs = a.epochs or (2 if software else 15)
    print(f"training on {min(limit, len(x))} of {len(x)} images for {epochs} epochs"
          + (" (software adapter: a smaller default run; pass --limit/--epochs for more)" if software and not a.limit else ""))
    x = (x[:limit].astype("float32") / 255.0)[..., None]
    y = y[:limit].astype("int32")
    xt = (xt.astype("float32") / 255.0)[..., None]
    yt = yt.astype("int32")
    data = ((x, y), (xt, yt))
    res = {a.device: train(tf, keras, a.device, data, epochs, a.batch_size, a.seed)}
    if a.compare_cpu:
        res["/CPU:0"] = train(tf, keras, "/CPU:0", data, epochs, a.batch_size, a.seed)
    print()
    print(f"{'device':<10}{'test accuracy':>15}{'train img/s':>14}{'infer img/s':>14}")
    for dev, r in res.items():
        print(f"{dev:<10}{r['accuracy']:>15.4f}{r['train_images_per_s']:>14.0f}{r['infer_images_per_s']:>14.0f}")
    if a.compare_cpu:
        g, c = res[a.device], res["/CPU:0"]
        print(f"ratio {a.device} / CPU: training {g['train_images_per_s'] / c['train_images_per_s']:.2f}x, "
              f"inference {g['infer_images_per_s'] / c['infer_images_per_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
