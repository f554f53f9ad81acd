"""Keras on GPU:0: a plain model.compile() trains (jit_compile="auto" resolves to no XLA on
tfwgpu devices), variables update inside tf.function, and losses track the CPU's."""
import contextlib

import numpy as np
import pytest

from conftest import on_gpu, ran_on_gpu


def test_assign_add_and_sub_inside_tf_function(tf):
    with tf.device("/GPU:0"):
        v = tf.Variable([1.0, 2.0, 3.0])

    @tf.function
    def step(d):
        v.assign_add(d)
        v.assign_sub(d * 0.25)
        return v.read_value()

    with tf.device("/GPU:0"):
        for _ in range(4):
            out = step(tf.constant([1.0, 2.0, 4.0]))
    assert on_gpu(v.handle) and on_gpu(out)
    np.testing.assert_array_equal(v.numpy(), [4.0, 8.0, 15.0])


def test_shape_ops_stay_on_the_device(tf):
    with tf.device("/GPU:0"):
        a = tf.ones([2, 3])
        outs = {
            "Reshape": tf.reshape(a, [3, 2]),
            "ExpandDims": tf.expand_dims(a, 0),
            "Squeeze": tf.squeeze(tf.ones([1, 3])),
            "Const": tf.constant([1.0, 2.0]),
            "Shape": tf.shape(a),
            "IdentityN": tf.identity_n([a, a])[0],
            "Snapshot": tf.raw_ops.Snapshot(input=a),
        }
    for name, t in outs.items():
        assert on_gpu(t), f"{name} ran on {t.device}"
    np.testing.assert_array_equal(outs["Shape"].numpy(), [2, 3])


def _mlp(keras, seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((20,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )


def _data():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((96, 20)).astype("float32")
    y = (x[:, 0] > 0).astype("int32") + (x[:, 1] > 1).astype("int32")
    return x, y


def _losses(keras):
    """A callback that keeps every training step's loss (`.values`)."""

    class Losses(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.values = []

        def on_train_batch_end(self, batch, logs=None):
            self.values.append(logs["loss"])

    return Losses()


def test_plain_compile_trains_on_gpu_and_tracks_cpu(tf):
    import keras

    x, y = _data()
    runs = {}
    for device in ["/GPU:0", "/CPU:0"]:
        with tf.device(device):
            model = _mlp(keras, 7)
            model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="sparse_categorical_crossentropy")
            cb = _losses(keras)
            model.fit(x, y, epochs=2, batch_size=16, shuffle=False, verbose=0, callbacks=[cb])
            runs[device] = (model, cb.values)
    gpu_model, gpu_losses = runs["/GPU:0"]
    assert gpu_model.jit_compile is False, "jit_compile='auto' must not pick XLA on tfwgpu"
    assert on_gpu(gpu_model.weights[0].value), "the weights live on GPU:0"
    cpu_losses = runs["/CPU:0"][1]
    # Same seed and data: float32 reassociation only, so the first steps agree closely and the
    # trend is the same.
    np.testing.assert_allclose(gpu_losses[:4], cpu_losses[:4], rtol=1e-4)
    assert gpu_losses[-1] < gpu_losses[0]
    np.testing.assert_allclose(gpu_losses[-1], cpu_losses[-1], rtol=2e-2)


def test_explicit_jit_compile_true_is_left_alone(tf):
    import keras

    with tf.device("/GPU:0"):
        model = _mlp(keras, 3)
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", jit_compile=True)
    assert model.jit_compile is True


def test_eager_gradient_tape_loop_with_a_keras_optimizer(tf):
    import keras

    x, y = _data()
    with tf.device("/GPU:0"):
        model = _mlp(keras, 5)
        opt = keras.optimizers.Adam(0.01)
        loss_fn = keras.losses.SparseCategoricalCrossentropy()
        losses = []
        for i in range(0, 96, 16):  # eager: no tf.function anywhere
            with tf.GradientTape() as tape:
                loss = loss_fn(y[i : i + 16], model(x[i : i + 16]))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            losses.append(float(loss))
    assert on_gpu(model.weights[0].value)
    assert int(opt.iterations.numpy()) == 6
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
def test_recurrent_layers_train_on_gpu_and_track_cpu(tf, layer):
    """Keras's LSTM and GRU (`use_cudnn="auto"`) pick the fused recurrent op (CudnnRNNV3)
    whenever TensorFlow lists a GPU; before the plugin had a kernel for it, `fit` failed at run
    time ("No OpKernel was registered to support Op 'CudnnRNNV3'"). It now runs the plugin's
    kernels forward and backward, with the losses of Keras's generic loop on the CPU;
    `use_cudnn=True` takes the same kernels."""
    import keras

    rng = np.random.default_rng(5)
    x = rng.standard_normal((48, 12, 6)).astype("float32")
    y = (x[:, :, 0].sum(axis=1) > 0).astype("int32") + (x[:, -1, 1] > 0.5).astype("int32")

    def model(cudnn):
        keras.utils.set_random_seed(4)
        return keras.Sequential(
            [keras.Input((12, 6)), getattr(keras.layers, layer)(16, use_cudnn=cudnn), keras.layers.Dense(3)]
        )

    runs = {}
    for device, cudnn in [("/GPU:0", "auto"), ("/GPU:0", True), ("/CPU:0", False)]:
        with tf.device(device):
            m = model(cudnn)
            m.compile(
                optimizer=keras.optimizers.Adam(0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
            cb = _losses(keras)
            gpu = device == "/GPU:0"
            with ran_on_gpu("CudnnRNNV3", "CudnnRNNBackpropV3") if gpu else contextlib.nullcontext():
                m.fit(x, y, epochs=3, batch_size=16, shuffle=False, verbose=0, callbacks=[cb])
            runs[(device, cudnn)] = (m, cb.values)
    cpu_losses = runs[("/CPU:0", False)][1]
    for key in [("/GPU:0", "auto"), ("/GPU:0", True)]:
        gpu_model, gpu_losses = runs[key]
        assert on_gpu(gpu_model.weights[0].value)
        # float32 reassociation only: 12 steps of the recurrence keep the first losses close.
        np.testing.assert_allclose(gpu_losses[:3], cpu_losses[:3], rtol=1e-4)
        assert gpu_losses[-1] < gpu_losses[0]
        np.testing.assert_allclose(gpu_losses[-1], cpu_losses[-1], rtol=2e-2)


@pytest.mark.parametrize("cudnn", ["auto", False])
def test_gru_fit_reads_only_what_keras_asks_for(tf, cudnn):
    """Keras `fit` of a GRU over 20 timesteps (the shape of bench/keras_fit_reads.py's gru),
    through the fused op ("auto") and Keras's generic loop: each step reads back the loss and
    the metric Keras asks for, and nothing for the loop (before: ~170 reads per step, the loop's
    condition every timestep and the shapes the forward loop keeps for the gradient)."""
    import keras
    import tensorflow_wgpu

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 20, 4)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int32)
    with tf.device("/GPU:0"):
        keras.utils.set_random_seed(1)
        m = keras.Sequential([keras.Input((20, 4)), keras.layers.GRU(8, use_cudnn=cudnn), keras.layers.Dense(10)])
        m.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
        m.fit(ds, steps_per_epoch=2, epochs=1, verbose=0)
        before = tensorflow_wgpu.stats()["runtime"]["reads"]
        m.fit(ds, steps_per_epoch=4, epochs=1, verbose=0)
        reads = tensorflow_wgpu.stats()["runtime"]["reads"] - before
    # Per step the loss and the metric; the epoch's end reads them once more.
    assert reads <= 4 * 2 + 2, reads
