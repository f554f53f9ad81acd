"""The reference models: the Keras programs tfwgpu is tested and measured with.

    python -m tensorflow_wgpu.models --model {mlp,cnn,resnet} [--mode {fit,loop}] [--steps N]
                                     [--batch-size N] [--device D] [--seed N]

1. mlp: Flatten, Dense(relu), Dropout, Dense(softmax); Adam.
2. cnn: Conv2D, BatchNormalization, ReLU, MaxPooling2D, Conv2D, AveragePooling2D, Dropout,
   Flatten, Dense; SGD with momentum.
3. resnet: a small residual network with DepthwiseConv2D, GlobalAveragePooling2D and Add;
   AdamW.

Each trains on real Fashion-MNIST images (the Debian package's IDX files) with a plain
`model.compile(...)` + `model.fit(...)` (mode fit) or a custom `tf.GradientTape` loop (mode
loop), and prints one line per step: `step N loss L`.
"""
import argparse
import os
import sys

MODELS = ("mlp", "cnn", "resnet")


def build(keras, name):
    """The model (uncompiled), its optimizer, and whether its outputs are logits."""
    L = keras.layers
    if name == "mlp":
        model = keras.Sequential(
            [
                keras.Input((28, 28, 1)),
                L.Flatten(),
                L.Dense(64, activation="relu"),
                L.Dropout(0.2),
                L.Dense(10, activation="softmax"),
            ]
        )
        return model, keras.optimizers.Adam(1e-3), False
    if name == "cnn":
        model = keras.Sequential(
            [
                keras.Input((28, 28, 1)),
                L.Conv2D(16, 3),
                L.BatchNormalization(),
                L.ReLU(),
                L.MaxPooling2D(),
                L.Conv2D(32, 3, padding="same"),
                L.AveragePooling2D(2),
                L.Dropout(0.25),
                L.Flatten(),
                L.Dense(10),
            ]
        )
        return model, keras.optimizers.SGD(0.02, momentum=0.9), True
    if name == "resnet":
        i = keras.Input((28, 28, 1))
        h = L.Conv2D(16, 3, strides=2, padding="same", activation="relu")(i)
        for _ in range(2):
            r = L.DepthwiseConv2D(3, padding="same")(h)
            r = L.BatchNormalization()(r)
            r = L.ReLU()(r)
            r = L.Conv2D(16, 1)(r)
            h = L.ReLU()(L.Add()([h, r]))
        h = L.GlobalAveragePooling2D()(h)
        o = L.Dense(10)(h)
        return keras.Model(i, o), keras.optimizers.AdamW(2e-3), True
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")


def data(n, seed=0):
    """The first `n` Fashion-MNIST training images as float32 NHWC in [0, 1], and labels."""
    from tensorflow_wgpu import fashion_mnist

    (x, y), _ = fashion_mnist.load()
    x = x[:n].reshape(-1, 28, 28, 1).astype("float32") / 255.0
    return x, y[:n].astype("int32")


def loss_fn(keras, logits):
    return keras.losses.SparseCategoricalCrossentropy(from_logits=logits)


def train_fit(tf, keras, name, x, y, device, epochs=1, batch_size=64, seed=0):
    """Plain compile + fit (Keras defaults, jit_compile left to Keras). Returns (model,
    per-batch losses as Keras reports them, the running epoch mean)."""
    keras.utils.set_random_seed(seed)
    losses = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            losses.append(float(logs["loss"]))

    with tf.device(device):
        model, opt, logits = build(keras, name)
        model.compile(optimizer=opt, loss=loss_fn(keras, logits), metrics=["accuracy"])
        model.fit(x, y, epochs=epochs, batch_size=batch_size, shuffle=False, verbose=0, callbacks=[Record()])
    return model, losses


def train_loop(tf, keras, name, x, y, device, steps, batch_size=64, seed=0):
    """A custom tf.GradientTape loop. Returns (model, the loss of each step)."""
    keras.utils.set_random_seed(seed)
    with tf.device(device):
        model, opt, logits = build(keras, name)
        lf = loss_fn(keras, logits)

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = lf(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        losses = []
        for s in range(steps):
            i = (s * batch_size) % len(x)
            xb = tf.constant(x[i : i + batch_size])
            yb = tf.constant(y[i : i + batch_size])
            losses.append(float(step(xb, yb)))
    return model, losses


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tensorflow_wgpu.models", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=MODELS, required=True)
    p.add_argument("--mode", choices=("fit", "loop"), default="fit")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", default="/GPU:0")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    x, y = data(a.steps * a.batch_size)
    if a.mode == "fit":
        model, losses = train_fit(tf, keras, a.model, x, y, a.device, batch_size=a.batch_size, seed=a.seed)
        with tf.device(a.device):
            model.predict(x[: a.batch_size], verbose=0)
            model.evaluate(x, y, batch_size=a.batch_size, verbose=0)
    else:
        model, losses = train_loop(tf, keras, a.model, x, y, a.device, a.steps, a.batch_size, a.seed)
    for i, loss in enumerate(losses):
        print(f"step {i} loss {loss:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
