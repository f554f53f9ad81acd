"""Comparisons, SelectV2 and DivNoNan in fused programs (crates/plugin/src/graph/fusion.rs,
crates/runtime/src/kernels/fused/): a comparison's bool stays in the program as a SelectV2's
condition (Keras's dropout: forward `select(random >= rate, x * scale, 0)`, gradient
`select(random >= rate, dy, 0) * scale`: five kernels become two, the comparison computed again
in the gradient's program from the same random values), DivNoNan joins the loss and metric
scalars' group; and Keras's label casts of host data run on the host
(crates/plugin/src/graph/pin.rs, `TFWGPU_PIN_CASTS=0` turns that off); a Conv2D or MatMul and
the BiasAdd after it run as one kernel call (crates/plugin/src/graph/epilogue.rs,
`TFWGPU_BIAS_EPILOGUE=0` turns that off: the same two kernels, the same bits).

Comparisons and selects are exact, DivNoNan one rounding (WGSL's division, as the unfused
kernel's): against the unfused kernels equal bits, against the CPU exact where the ops are
exact."""
import os

import numpy as np
import pytest

import tensorflow_wgpu
from conftest import on_gpu

FUSED = "_TfwgpuFusedElementwise"
MULTI = "_TfwgpuFusedElementwiseMulti"


def _ops():
    return dict(tensorflow_wgpu.stats()["gpu_ops"])


def _delta(before, after):
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


class _Env:
    def __init__(self, **kv):
        self.kv = kv

    def __enter__(self):
        self.old = {k: os.environ.get(k) for k in self.kv}
        os.environ.update(self.kv)

    def __exit__(self, *exc):
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run(tf, f, args, fusion="1"):
    """f as a fresh tf.function on GPU:0 (optimized with TFWGPU_FUSION=fusion): its outputs on
    the second call and the kernels that call ran."""
    with _Env(TFWGPU_FUSION=fusion), tf.device("/GPU:0"):
        g = tf.function(f)
        ins = [tf.constant(a) for a in args]
        g(*ins)
        before = _ops()
        out = g(*ins)
        return [o.numpy() for o in out], _delta(before, _ops())


def test_compare_read_by_two_selects_fuses_into_both(tf):
    """One comparison, two selects in different groups (each with its own arithmetic): the
    comparison is copied into both programs; no comparison or select kernel runs."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((7, 129)).astype(np.float32)
    b = rng.standard_normal((129,)).astype(np.float32)
    a[0, :5] = [np.nan, 0.0, -0.0, np.inf, -np.inf]
    b[:5] = [0.0, -0.0, 0.0, np.inf, 1.0]

    def f(a, b):
        m = a >= b
        y = tf.where(m, a * 2.0, tf.zeros_like(a))
        z = tf.where(m, tf.exp(b) - 1.0, a)
        return tf.nn.relu(y) + 1.0, tf.math.abs(z)

    with tf.device("/CPU:0"):
        want = [t.numpy() for t in tf.function(f)(tf.constant(a), tf.constant(b))]
    got, d = _run(tf, f, [a, b])
    unfused, d_off = _run(tf, f, [a, b], fusion="0")
    assert "GreaterEqual" not in d and "SelectV2" not in d, d
    assert d_off.get("GreaterEqual", 0) == 1 and d_off.get("SelectV2", 0) == 2, d_off
    assert sum(d.values()) == 2, d
    for g, u, w in zip(got, unfused, want):
        np.testing.assert_array_equal(g.view(np.uint32), u.view(np.uint32))
    # Exact ops against the CPU (the select of a * 2 and the comparisons); exp within an ulp.
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=2e-6)


@pytest.mark.parametrize("cmp", ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"])
def test_each_comparison_in_a_select_matches_cpu(tf, cmp):
    # (No subnormals: TensorFlow's CPU flushes them to zero, the GPU kernels do not.)
    special = np.array([0.0, -0.0, 1.0, -1.0, np.nan, np.inf, -np.inf, 1e-30], np.float32)
    a = np.repeat(special, len(special))
    b = np.tile(special, len(special))

    def f(a, b):
        return (tf.where(getattr(tf.math, cmp)(a, b), a + 1.0, b * 3.0),)

    with tf.device("/CPU:0"):
        want = tf.function(f)(tf.constant(a), tf.constant(b))[0].numpy()
    got, d = _run(tf, f, [a, b])
    assert sum(d.values()) == 1 and d.get(FUSED) == 1, d
    np.testing.assert_array_equal(got[0], want)


def test_a_compare_returned_as_bool_stays_a_kernel(tf):
    """A comparison whose bool leaves the function is no program's value: its kernel runs, and
    the select that also reads it still fuses with a copy."""
    a = np.linspace(-2, 2, 33).astype(np.float32)

    def f(a):
        m = a > 0.5
        return m, tf.where(m, a * 4.0, -a)

    with tf.device("/CPU:0"):
        want = [t.numpy() for t in tf.function(f)(tf.constant(a))]
    got, d = _run(tf, f, [a])
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert d.get("Greater", 0) == 1, d


def _dropout_grads(tf, keras, fusion, x, dy):
    with _Env(TFWGPU_FUSION=fusion), tf.device("/GPU:0"):
        layer = keras.layers.Dropout(0.4, seed=77)

        @tf.function
        def f(x, dy):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x, training=True)
                loss = tf.reduce_sum(y * dy)
            return y, tape.gradient(loss, x)

        xs, dys = tf.constant(x), tf.constant(dy)
        f(xs, dys)
        before = _ops()
        out = [t.numpy() for t in f(xs, dys)]
        return out, _delta(before, _ops())


def test_dropout_forward_and_gradient_are_two_kernels(tf):
    import keras

    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 13, 13, 3)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    keras.utils.set_random_seed(3)
    (y, gx), d = _dropout_grads(tf, keras, "1", x, dy)
    keras.utils.set_random_seed(3)
    (y_off, gx_off), d_off = _dropout_grads(tf, keras, "0", x, dy)
    for op in ("GreaterEqual", "SelectV2"):
        assert op not in d, d
        assert d_off.get(op, 0) >= 1, d_off
    # The masks (same seed, same random values) and so the results are the same bits.
    np.testing.assert_array_equal(y, y_off)
    np.testing.assert_array_equal(gx, gx_off)
    # Dropout's values: kept x / (1 - rate), the gradient dy / (1 - rate) where kept, else 0.
    kept = y != 0
    assert 0.4 < kept.mean() < 0.8, kept.mean()
    scale = np.float32(1.0) / np.float32(0.6)
    np.testing.assert_array_equal(y[kept], x[kept] * scale)
    np.testing.assert_array_equal(gx, np.where(kept, dy * scale, np.float32(0)))


def test_div_no_nan_scalars_match_cpu(tf):
    def f(s, n, t, c):
        loss = tf.math.divide_no_nan(s, n)
        total = t + loss * n
        count = c + n
        return total, count, tf.math.divide_no_nan(total, count)

    for args in ([12.5, 64.0, 100.0, 640.0], [3.0, 0.0, 0.0, 0.0], [np.nan, 0.0, 1.0, -0.0]):
        a = [np.float32(v) for v in args]
        with tf.device("/CPU:0"):
            want = [t.numpy() for t in tf.function(f)(*[tf.constant(v) for v in a])]
        got, d = _run(tf, f, a)
        assert "DivNoNan" not in d and sum(d.values()) == 1, d
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def _fit_cnn(tf, keras, pin_casts, epilogue="1"):
    with _Env(TFWGPU_PIN_CASTS=pin_casts, TFWGPU_BIAS_EPILOGUE=epilogue):
        keras.utils.set_random_seed(11)
        rng = np.random.default_rng(11)
        x = rng.random((32, 10, 10, 1), dtype=np.float32)
        y = rng.integers(0, 4, 32).astype(np.int32)
        with tf.device("/CPU:0"):
            ds = tf.data.Dataset.from_tensors((x, y)).repeat()
        with tf.device("/GPU:0"):
            m = keras.Sequential([
                keras.Input((10, 10, 1)),
                keras.layers.Conv2D(4, 3),
                keras.layers.Flatten(),
                keras.layers.Dropout(0.25, seed=3),
                keras.layers.Dense(4),
            ])
            m.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            m.fit(ds, steps_per_epoch=1, epochs=1, verbose=0)
            before = _ops()
            h = m.fit(ds, steps_per_epoch=4, epochs=1, verbose=0)
            return h.history["loss"], [w.numpy() for w in m.weights], _delta(before, _ops())


def test_keras_fit_casts_labels_on_the_host_with_equal_results(tf):
    import keras

    loss_on, w_on, d_on = _fit_cnn(tf, keras, "1")
    loss_off, w_off, d_off = _fit_cnn(tf, keras, "0")
    # Off: the labels' two casts (int32 -> float32 -> int64) run on the device every step.
    assert d_off.get("Cast", 0) >= 8, d_off
    assert d_on.get("Cast", 0) == 0, d_on
    # The dropout's comparison and selects and the step's DivNoNans run in fused programs (a
    # DivNoNan may run once per fit, outside the steps).
    for op in ("GreaterEqual", "SelectV2", "DivNoNan"):
        assert d_on.get(op, 0) <= 1, d_on
    np.testing.assert_array_equal(loss_on, loss_off)
    for a, b in zip(w_on, w_off):
        np.testing.assert_array_equal(a, b)
    assert np.all(np.isfinite(loss_on))


def test_keras_fit_adds_biases_in_their_products_kernel_call_with_equal_results(tf):
    import keras

    loss_on, w_on, d_on = _fit_cnn(tf, keras, "1", epilogue="1")
    loss_off, w_off, d_off = _fit_cnn(tf, keras, "1", epilogue="0")
    # Off: the convolution's and the dense layer's BiasAdd run as kernels every step.
    assert d_off.get("BiasAdd", 0) >= 8 and d_off.get("Conv2D", 0) >= 4, d_off
    assert d_on.get("BiasAdd", 0) == 0 and d_on.get("Conv2D", 0) == 0, d_on
    assert d_on.get("_TfwgpuConv2DBiasAdd", 0) >= 4 and d_on.get("_TfwgpuMatMulBiasAdd", 0) >= 4, d_on
    assert sum(d_on.values()) <= sum(d_off.values()) - 8, (d_on, d_off)
    np.testing.assert_array_equal(loss_on, loss_off)
    for a, b in zip(w_on, w_off):
        np.testing.assert_array_equal(a, b)


def test_inference_of_conv_and_dense_with_bias_matches_cpu(tf):
    """model(x) of a Conv2D (SAME, stride 2) and a Dense, each with its bias: against the CPU
    within the products' rounding, and the two kernel calls fewer."""
    import keras

    keras.utils.set_random_seed(2)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 9, 9, 3)).astype(np.float32)
    m = keras.Sequential([keras.Input((9, 9, 3)), keras.layers.Conv2D(7, 3, strides=2, padding="same"),
                          keras.layers.AveragePooling2D(2), keras.layers.Flatten(), keras.layers.Dense(11)])
    with tf.device("/CPU:0"):
        want = m(tf.constant(x), training=False).numpy()
    with tf.device("/GPU:0"):
        f = tf.function(lambda v: m(v, training=False))
        xd = tf.constant(x)
        f(xd)
        before = _ops()
        got = f(xd).numpy()
        d = _delta(before, _ops())
    assert d.get("_TfwgpuConv2DBiasAdd") == 1 and d.get("_TfwgpuMatMulBiasAdd") == 1, d
    assert "BiasAdd" not in d, d
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
