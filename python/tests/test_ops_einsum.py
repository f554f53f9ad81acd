"""Einsum on /GPU:0 against /CPU:0: the equations of Keras's EinsumDense and
MultiHeadAttention and general ones (transposes, sums, diagonals, ellipsis broadcasting), with
their gradients, float32 and float16,
TensorFlow's errors, and a MultiHeadAttention training step that now keeps its attention on
the GPU and reads nothing back mid-step."""
import numpy as np
import pytest

import tensorflow_wgpu
from conftest import ran_on_gpu, same_error

EQUATIONS = [
    ("abc,cde->abde", [(2, 5, 8), (8, 3, 4)]),
    ("abcd,cde->abe", [(2, 5, 3, 4), (3, 4, 8)]),
    ("aecd,abcd->acbe", [(2, 6, 3, 4), (2, 5, 3, 4)]),
    ("acbe,aecd->abcd", [(2, 3, 5, 6), (2, 6, 3, 4)]),
    ("ij,jk->ik", [(7, 33), (33, 9)]),
    ("ji,jk->ki", [(6, 3), (6, 5)]),
    ("bij,bjk->bik", [(3, 4, 5), (3, 5, 2)]),
    ("ijk,jil->kl", [(3, 4, 5), (4, 3, 2)]),
    ("ij,jk->k", [(3, 4), (4, 5)]),
    ("i,j->ij", [(5,), (7,)]),
    ("i,i->", [(9,), (9,)]),
    ("ij,ij->ij", [(4, 5), (4, 5)]),
    ("ij->ji", [(5, 7)]),
    ("ijk->ki", [(3, 4, 5)]),
    ("ij->", [(5, 7)]),
    ("ii->i", [(5, 5)]),
    ("iij->ji", [(4, 4, 3)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
    ("...i,i->...", [(2, 3, 4), (4,)]),
    ("ij,jk->ik", [(0, 3), (3, 4)]),
    ("ij,jk->ik", [(3, 0), (0, 4)]),
]


def _both(tf, eq, arrays):
    """The product and its gradients (through a weighted sum, so every output element
    counts differently) on both devices."""

    def f(*xs):
        with tf.GradientTape() as tape:
            tape.watch(xs)
            y = tf.einsum(eq, *xs)
            w = tf.reshape(tf.cast(tf.range(tf.size(y)), y.dtype), tf.shape(y)) / 7.0
            s = tf.reduce_sum(y * w)
        return [y] + tape.gradient(s, list(xs))

    out = {}
    for dev in ["/GPU:0", "/CPU:0"]:
        with tf.device(dev):
            out[dev] = [t.numpy() for t in f(*[tf.constant(a) for a in arrays])]
    return out["/GPU:0"], out["/CPU:0"]


@pytest.mark.parametrize("eq,shapes", EQUATIONS, ids=[e + str(s) for e, s in EQUATIONS])
def test_einsum_f32_and_gradients(tf, eq, shapes):
    rng = np.random.default_rng(len(eq) * 31 + sum(map(len, shapes)))
    arrays = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    empty = any(a.size == 0 for a in arrays)
    with ran_on_gpu() if empty else ran_on_gpu("Einsum"):
        g, c = _both(tf, eq, arrays)
    # Sums of up to K products of values in [-1, 1], times weights up to size/7: a few f32
    # ulp of the largest partial sums.
    k = max(a.size for a in arrays)
    for gi, ci in zip(g, c):
        assert gi.shape == ci.shape and gi.dtype == ci.dtype
        scale = max(1.0, float(np.abs(ci).max(initial=0.0)))
        np.testing.assert_allclose(gi, ci, rtol=0, atol=4 * k * 1.2e-7 * scale)


@pytest.mark.parametrize("eq,shapes", [EQUATIONS[2], EQUATIONS[3], EQUATIONS[7]], ids=str)
def test_einsum_f16(tf, eq, shapes):
    rng = np.random.default_rng(5)
    arrays = [rng.uniform(-1, 1, s).astype(np.float16) for s in shapes]
    with ran_on_gpu("Einsum"):
        with tf.device("/GPU:0"):
            g = tf.einsum(eq, *[tf.constant(a) for a in arrays]).numpy()
    want = np.einsum(eq, *[a.astype(np.float64) for a in arrays])
    # f32 accumulation rounded once to f16 (TensorFlow's CPU kernel rounds differently, so
    # the float64 product is the reference): half an f16 ulp plus f32 sums.
    k = max(a.size for a in arrays)
    np.testing.assert_allclose(g.astype(np.float64), want, rtol=2 ** -11, atol=k * 1e-6)
    assert g.dtype == np.float16


def test_einsum_raw_output_diagonal(tf):
    """Labels repeated in the output (tf.einsum's Python layer refuses them; the op takes
    them, and TensorFlow's own gradient of a diagonal uses them): the diagonal is written,
    the rest is zero."""
    for dtype in ["float32", "float16"]:
        x = np.arange(1, 16, dtype=dtype).reshape(3, 5)
        for eq in ["ij->iji", "ij->iij", "ij->jiij"]:
            res = {}
            for dev in ["/GPU:0", "/CPU:0"]:
                with tf.device(dev):
                    res[dev] = tf.raw_ops.Einsum(inputs=[tf.constant(x)], equation=eq).numpy()
            np.testing.assert_array_equal(res["/GPU:0"], res["/CPU:0"])


def test_einsum_batched_diagonal_gradient(tf):
    """The gradient of a batched diagonal (`bii->bi`) is an Einsum with a repeated output label
    (`bi->bii`) over the whole batch: one pass over the output, any batch size."""
    x = np.random.default_rng(8).standard_normal((5000, 3, 3)).astype(np.float32)
    res = {}
    for dev in ["/GPU:0", "/CPU:0"]:
        with tf.device(dev):
            v = tf.constant(x)
            with tf.GradientTape() as tape:
                tape.watch(v)
                y = tf.einsum("bii->bi", v)
                s = tf.reduce_sum(y * y)
            res[dev] = (y.numpy(), tape.gradient(s, v).numpy())
    np.testing.assert_array_equal(res["/GPU:0"][0], res["/CPU:0"][0])
    np.testing.assert_allclose(res["/GPU:0"][1], res["/CPU:0"][1], rtol=1e-6)


@pytest.mark.parametrize(
    "eq,shapes",
    [("ij,jk->ik", [(2, 3), (4, 4)]), ("...ij->ij", [(2, 3, 4)]), ("ij,jk", [(2, 3), (3, 4)])],
)
def test_einsum_errors_are_tensorflows(tf, eq, shapes):
    same_error(tf, lambda: tf.raw_ops.Einsum(inputs=[tf.zeros(s) for s in shapes], equation=eq))


def test_multi_head_attention_trains_on_the_gpu_without_mid_step_reads(tf):
    """Keras's MultiHeadAttention (EinsumDense projections, einsum attention products): a
    training step runs every Einsum on the GPU, reads nothing back mid-step (the attention
    products had no kernel and went to the CPU and back), and its loss and gradients are
    the CPU's."""
    import keras

    rng = np.random.default_rng(21)
    x = rng.standard_normal((4, 6, 8)).astype(np.float32)
    y = rng.standard_normal((4, 6, 8)).astype(np.float32)
    results = {}
    for device in ["/CPU:0", "/GPU:0"]:
        with tf.device(device):
            keras.utils.set_random_seed(3)
            inp = keras.Input((6, 8))
            out = keras.layers.MultiHeadAttention(2, 4)(inp, inp)
            model = keras.Model(inp, out)

            @tf.function(input_signature=[tf.TensorSpec([None, 6, 8])] * 2)
            def step(xb, yb):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
                return loss, tape.gradient(loss, model.trainable_weights)

            xd, yd = tf.identity(tf.constant(x)), tf.identity(tf.constant(y))
            step(xd, yd)
            s0 = tensorflow_wgpu.stats()
            loss, grads = step(xd, yd)
            s1 = tensorflow_wgpu.stats()
            reads = s1["runtime"]["reads"] - s0["runtime"]["reads"]
            einsums = s1["gpu_ops"].get("Einsum", 0) - s0["gpu_ops"].get("Einsum", 0)
            results[device] = (loss.numpy(), [g.numpy() for g in grads], reads, einsums)
    loss, grads, reads, einsums = results["/GPU:0"]
    # 4 projections and 2 attention products (TensorFlow writes their gradients as
    # BatchMatMulV2, Reshape and Sum).
    assert einsums == 6, einsums
    assert reads == 0, reads
    want_loss, want_grads, _, _ = results["/CPU:0"]
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
