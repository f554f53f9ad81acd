"""Seed arithmetic on the host (the plugin's graph pass crates/plugin/src/graph/pin.rs): Keras's
random layers keep a tiny int64 seed state on the device; inside tf.function the next state
and the op's seed (FloorMod, Cast) run on the host's CPU, so the stateless random op's
host-memory seed is never read back from the GPU mid-step (that read waited for all the GPU
work queued before it). `TFWGPU_PIN_SEEDS=0` (read each time a graph is optimized) turns it
off. The values are the same: the same integer ops on the same inputs."""
import os

import numpy as np

import tensorflow_wgpu


def _dropout_run(tf, keras, pin, calls=4):
    """Outputs of a seeded Dropout in training mode on GPU:0 (a fresh layer and tf.function,
    so the graph is optimized with TFWGPU_PIN_SEEDS=pin), the runtime's reads of the device
    during the calls, and the int64 FloorMod kernels the device ran."""
    old = os.environ.get("TFWGPU_PIN_SEEDS")
    os.environ["TFWGPU_PIN_SEEDS"] = pin
    try:
        x = np.arange(1, 4 * 37 + 1, dtype=np.float32).reshape(4, 37)
        with tf.device("/GPU:0"):
            layer = keras.layers.Dropout(0.5, seed=1234)
            xd = tf.identity(tf.constant(x))

            @tf.function
            def f(v):
                return layer(v, training=True)

            f(xd).numpy()  # trace, optimize, warm up
            s0 = tensorflow_wgpu.stats()
            outs = [f(xd) for _ in range(calls)]
            s1 = tensorflow_wgpu.stats()
            vals = [o.numpy() for o in outs]
    finally:
        if old is None:
            os.environ.pop("TFWGPU_PIN_SEEDS", None)
        else:
            os.environ["TFWGPU_PIN_SEEDS"] = old
    reads = s1["runtime"]["reads"] - s0["runtime"]["reads"]
    floormod = s1["gpu_ops"].get("FloorMod", 0) - s0["gpu_ops"].get("FloorMod", 0)
    return x, vals, reads, floormod


def test_dropout_seed_stays_on_the_host_with_the_same_masks(tf):
    import keras

    x, on, reads_on, mod_on = _dropout_run(tf, keras, "1")
    _, off, reads_off, mod_off = _dropout_run(tf, keras, "0")
    # Off: the seed (FloorMod, Cast on the GPU) is read back every call.
    assert mod_off >= 4 and reads_off >= 4, (mod_off, reads_off)
    # On: no seed kernels on the GPU and no read of the device during the calls (the state's
    # bytes are answered by the host mirror: the host wrote them).
    assert mod_on == 0 and reads_on == 0, (mod_on, reads_on)
    # The same masks call by call, and a new mask each call.
    for a, b in zip(on, off):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(on[0], m) for m in on[1:])
    for v in on:
        kept = v != 0
        np.testing.assert_allclose(v[kept], 2.0 * x[kept], rtol=1e-6)
        assert 0 < kept.sum() < kept.size


def test_keras_fit_with_dropout_is_unchanged_by_the_pass(tf):
    """A Keras model with Dropout trained a few steps: the same losses with the pass on and off
    (the seeds, hence the masks, are the same)."""
    import keras

    def run(pin):
        old = os.environ.get("TFWGPU_PIN_SEEDS")
        os.environ["TFWGPU_PIN_SEEDS"] = pin
        try:
            keras.utils.set_random_seed(5)
            rng = np.random.default_rng(5)
            x = rng.random((16, 12), dtype=np.float32)
            y = rng.integers(0, 3, 16).astype(np.int32)
            with tf.device("/GPU:0"):
                m = keras.Sequential([keras.Input((12,)), keras.layers.Dense(8, activation="relu"),
                                      keras.layers.Dropout(0.3, seed=9), keras.layers.Dense(3)])
                m.compile(optimizer=keras.optimizers.SGD(0.1),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
                h = m.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False)
            return h.history["loss"]
        finally:
            if old is None:
                os.environ.pop("TFWGPU_PIN_SEEDS", None)
            else:
                os.environ["TFWGPU_PIN_SEEDS"] = old

    on, off = run("1"), run("0")
    np.testing.assert_allclose(on, off, rtol=1e-6)
