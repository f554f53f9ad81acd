"""The ops added by the ewextra round, through TensorFlow: each on /GPU:0 against /CPU:0 with
random data and awkward shapes, every registered dtype, gradients through tf.GradientTape for
the differentiable ones, tf.where with data-dependent output sizes, and a check (the plugin's
per-op counters, tensorflow_wgpu.stats()) that the kernels really ran on the GPU."""
import numpy as np
import pytest

from conftest import ran_on_gpu

SHAPES = [(7,), (3, 129), (0, 5), (), (2, 3, 5)]
FLOATS = ["float32", "float16"]


def data(rng, shape, dtype, scale=4.0, specials=True):
    x = (rng.standard_normal(shape) * scale).astype(dtype)
    if specials and x.size >= 7:
        flat = x.reshape(-1)
        flat[:7] = [0.0, -0.0, np.nan, np.inf, -np.inf, 6.0, -1.0]
    return x


def run_both(tf, fn, *arrays):
    with tf.device("/GPU:0"):
        g = fn(*[tf.constant(a) for a in arrays])
    with tf.device("/CPU:0"):
        c = fn(*[tf.constant(a) for a in arrays])
    return g, c


def tol(dtype):
    # A few f32 ulp; f16: one rounding of an f32 result (the CPU's half path may round
    # intermediates too).
    return dict(rtol=2e-6, atol=1e-6) if dtype == "float32" else dict(rtol=2e-3, atol=1e-3)


def close(g, c, **kw):
    assert g.dtype == c.dtype and g.shape == c.shape, (g.dtype, c.dtype, g.shape, c.shape)
    if g.dtype.is_bool or g.dtype.is_integer:
        np.testing.assert_array_equal(g.numpy(), c.numpy())
    else:
        np.testing.assert_allclose(
            g.numpy().astype(np.float64), c.numpy().astype(np.float64), equal_nan=True, **kw
        )


UNARY = [
    ("Sin", lambda tf: tf.sin),
    ("Cos", lambda tf: tf.cos),
    ("Tan", lambda tf: tf.math.tan),
    ("Relu6", lambda tf: tf.nn.relu6),
    ("Elu", lambda tf: tf.nn.elu),
    ("Selu", lambda tf: tf.nn.selu),
    ("LeakyRelu", lambda tf: (lambda x: tf.nn.leaky_relu(x, alpha=0.3))),
    ("Softsign", lambda tf: tf.nn.softsign),
    ("IsNan", lambda tf: tf.math.is_nan),
    ("IsInf", lambda tf: tf.math.is_inf),
    ("IsFinite", lambda tf: tf.math.is_finite),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op,fn", UNARY, ids=[u[0] for u in UNARY])
def test_unary(tf, op, fn, shape, dtype):
    x = data(np.random.default_rng(1), shape, dtype)
    ctx = ran_on_gpu(op) if x.size else ran_on_gpu()
    with ctx:
        g, c = run_both(tf, fn(tf), x)
    close(g, c, **tol(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_sin_cos_large_arguments(tf, dtype):
    rng = np.random.default_rng(2)
    hi = 6e4 if dtype == "float16" else 3e38
    x = np.concatenate(
        [rng.uniform(-hi, hi, 300), rng.uniform(-1e4, 1e4, 300), np.arange(1, 200) * np.pi / 2]
    ).astype(dtype)
    for fn in (tf.sin, tf.cos):
        g, c = run_both(tf, fn, x)
        # Both accurate to a few ulp: compare within the magnitude of the results.
        close(g, c, rtol=0, atol=4e-7 if dtype == "float32" else 1e-3)


GRADS = [
    ("Relu6Grad", lambda tf: tf.nn.relu6),
    ("EluGrad", lambda tf: tf.nn.elu),
    ("SeluGrad", lambda tf: tf.nn.selu),
    ("LeakyReluGrad", lambda tf: (lambda x: tf.nn.leaky_relu(x, alpha=0.15))),
    ("SoftsignGrad", lambda tf: tf.nn.softsign),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op,fn", GRADS, ids=[g[0] for g in GRADS])
def test_activation_gradients(tf, op, fn, dtype):
    rng = np.random.default_rng(3)
    x = data(rng, (4, 33), dtype, specials=False)
    dy = data(rng, (4, 33), dtype, scale=1.0, specials=False)

    def grad(x, dy):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(tf)(x)
        return tape.gradient(y, x, output_gradients=dy)

    with ran_on_gpu(op):
        g, c = run_both(tf, grad, x, dy)
    close(g, c, **tol(dtype))


@pytest.mark.parametrize("dtype", FLOATS + ["int64"])
@pytest.mark.parametrize("bounds", ["scalar", "min_full", "max_full", "full"])
def test_clip_by_value(tf, dtype, bounds):
    rng = np.random.default_rng(4)
    shape = (5, 129)
    if dtype == "int64":
        t = rng.integers(-100, 100, shape).astype(dtype)
    else:
        t = data(rng, shape, dtype)
    lo = (np.full(shape, -1) + rng.integers(-2, 1, shape)).astype(dtype)
    hi = (np.full(shape, 2) + rng.integers(0, 3, shape)).astype(dtype)
    if bounds in ("scalar", "max_full"):
        lo = np.array(-1, dtype)
    if bounds in ("scalar", "min_full"):
        hi = np.array(2, dtype)
    with ran_on_gpu("ClipByValue"):
        g, c = run_both(
            tf, lambda a, b, d: tf.raw_ops.ClipByValue(t=a, clip_value_min=b, clip_value_max=d), t, lo, hi
        )
    close(g, c, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", FLOATS)
def test_clip_by_value_gradient(tf, dtype):
    rng = np.random.default_rng(5)
    x = data(rng, (3, 17), dtype, specials=False)

    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.clip_by_value(x, -1.0, 1.5)
            y2 = tf.raw_ops.ClipByValue(
                t=x, clip_value_min=tf.constant(-0.5, x.dtype), clip_value_max=tf.constant(2.0, x.dtype)
            )
            s = tf.reduce_sum(y * y) + tf.reduce_sum(y2) if dtype == "float32" else tf.reduce_sum(y * y2)
        return tape.gradient(s, x)

    with ran_on_gpu("ClipByValue"):
        g, c = run_both(tf, grad, x)
    close(g, c, **tol(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_sin_cos_gradients(tf, dtype):
    x = data(np.random.default_rng(6), (5, 7), dtype, specials=False)

    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.sin(x) * tf.cos(x)
        return tape.gradient(y, x)

    with ran_on_gpu("Sin", "Cos"):
        g, c = run_both(tf, grad, x)
    close(g, c, **tol(dtype))


@pytest.mark.parametrize("op", ["All", "Any"])
@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2), ()])
@pytest.mark.parametrize("keepdims", [False, True])
def test_all_any(tf, op, axis, keepdims):
    rng = np.random.default_rng(7)
    x = rng.random((3, 5, 7)) < (0.9 if op == "All" else 0.1)
    fn = tf.reduce_all if op == "All" else tf.reduce_any
    with ran_on_gpu(op):
        g, c = run_both(tf, lambda a: fn(a, axis=axis, keepdims=keepdims), x)
    close(g, c)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "bool", "uint8"])
def test_reverse_v1(tf, dtype):
    rng = np.random.default_rng(8)
    x = rng.integers(0, 2, (3, 4, 5)).astype(dtype) if dtype == "bool" else (rng.standard_normal((3, 4, 5)) * 50).astype(dtype)
    for dims in ([True, False, True], [False, False, False], [False, True, False]):
        with ran_on_gpu("Reverse"):
            g, c = run_both(tf, lambda a: tf.raw_ops.Reverse(tensor=a, dims=tf.constant(dims)), x)
        close(g, c)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_f16(tf, op):
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((4, 129)) * 3).astype("float16")
    fn = tf.nn.softmax if op == "Softmax" else tf.nn.log_softmax
    with ran_on_gpu(op):
        g, c = run_both(tf, fn, x)
    close(g, c, rtol=2e-3, atol=2e-3)

    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
            s = tf.reduce_sum(y * tf.cast(tf.range(129), tf.float16) / 100)
        return tape.gradient(s, x)

    g, c = run_both(tf, grad, x)
    close(g, c, rtol=1e-2, atol=1e-2)


def test_xent_f16(tf):
    rng = np.random.default_rng(10)
    logits = (rng.standard_normal((6, 11)) * 2).astype("float16")
    labels = rng.integers(0, 11, 6).astype("int32")
    dense = rng.random((6, 11)).astype("float16")
    with ran_on_gpu("SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits"):
        g, c = run_both(
            tf, lambda a, b: tf.nn.sparse_softmax_cross_entropy_with_logits(labels=b, logits=a), logits, labels
        )
        close(g, c, rtol=2e-3, atol=2e-3)
        g, c = run_both(tf, lambda a, b: tf.nn.softmax_cross_entropy_with_logits(labels=b, logits=a), logits, dense)
        close(g, c, rtol=2e-3, atol=5e-3)


@pytest.mark.parametrize("shapes", [((7, 5), (5, 3)), ((33, 129), (129, 17)), ((0, 4), (4, 3))], ids=str)
def test_matmul_f16(tf, shapes):
    rng = np.random.default_rng(11)
    a = rng.uniform(-1, 1, shapes[0]).astype("float16")
    b = rng.uniform(-1, 1, shapes[1]).astype("float16")

    def f(a, b):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            y = tf.matmul(a, b)
            s = tf.reduce_sum(y * y)
        ga, gb = tape.gradient(s, [a, b])
        return y, ga, gb

    with ran_on_gpu("MatMul") if a.size else ran_on_gpu():
        g, c = run_both(tf, f, a, b)
    k = shapes[0][1]
    for gi, ci in zip(g, c):
        close(gi, ci, rtol=3e-3, atol=3e-3 * k)


def test_batch_matmul_and_bias_f16(tf):
    rng = np.random.default_rng(12)
    a = rng.uniform(-1, 1, (3, 5, 9)).astype("float16")
    b = rng.uniform(-1, 1, (1, 9, 4)).astype("float16")
    with ran_on_gpu("BatchMatMulV2"):
        g, c = run_both(tf, lambda x, y: tf.linalg.matmul(x, y), a, b)
    close(g, c, rtol=3e-3, atol=1e-2)
    x = rng.uniform(-1, 1, (6, 7, 5)).astype("float16")
    with ran_on_gpu("BiasAddGrad"):
        g, c = run_both(tf, lambda v: tf.raw_ops.BiasAddGrad(out_backprop=v), x)
    close(g, c, rtol=3e-3, atol=1e-2)
    with ran_on_gpu("L2Loss"):
        g, c = run_both(tf, tf.nn.l2_loss, x)
    close(g, c, rtol=3e-3, atol=1e-2)


WHERE_SHAPES = [(7,), (3, 129), (0, 4), (2, 3, 4), (2, 1, 3, 2, 2)]


@pytest.mark.parametrize("dtype", ["bool", "float32", "int32", "int64", "uint8"])
@pytest.mark.parametrize("shape", WHERE_SHAPES, ids=str)
@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
def test_where(tf, dtype, shape, density):
    rng = np.random.default_rng(13)
    mask = rng.random(shape) < density
    x = (mask * rng.integers(1, 5, shape)).astype(dtype)
    if dtype == "float32" and x.size:
        x = np.where(mask, x, -0.0).astype(dtype)
    # int32: TensorFlow has a DEVICE_DEFAULT host-memory Where kernel for int32, and the plugin
    # leaves int32 to it (shape arithmetic stays on the host), so only the result is checked.
    with ran_on_gpu("Where") if x.size and dtype != "int32" else ran_on_gpu():
        g, c = run_both(tf, lambda a: tf.where(a), x)
    close(g, c)
    assert g.shape[0] == int(mask.sum())


def test_where_scalar_is_an_error(tf):
    for dev in ("/GPU:0", "/CPU:0"):
        with tf.device(dev):
            with pytest.raises(tf.errors.InvalidArgumentError):
                tf.where(tf.constant(True))


def test_where_in_function(tf):
    """Data-dependent sizes inside a tf.function, feeding further GPU ops."""

    @tf.function
    def f(x):
        idx = tf.where(x > 0.5)
        return idx, tf.gather_nd(x, idx)

    rng = np.random.default_rng(14)
    for n in (0, 1, 1000):
        x = rng.random((n, 3)).astype("float32")
        with tf.device("/GPU:0"):
            gi, gv = f(tf.constant(x))
        np.testing.assert_array_equal(gi.numpy(), np.argwhere(x > 0.5))
        np.testing.assert_array_equal(gv.numpy(), x[x > 0.5])


CUMSUM_CASES = [((7,), 0), ((3, 200, 4), 1), ((5, 6), -1), ((2, 3, 4), 0), ((0, 3), 1), ((70001,), 0), ((40000, 2), 0)]


@pytest.mark.parametrize("shape,axis", CUMSUM_CASES, ids=str)
def test_cumsum(tf, shape, axis):
    """Cumsum (AUC's sums over thresholds) in TensorFlow's order: the same float32 sums as the
    CPU, with exclusive and reverse; axes longer than one dispatch's chunk (32,768) continue
    from the previous chunk's sum."""
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    for exclusive in (False, True):
        for reverse in (False, True):
            f = lambda v: tf.math.cumsum(v, axis=axis, exclusive=exclusive, reverse=reverse)
            with ran_on_gpu("Cumsum") if x.size else ran_on_gpu():
                g, c = run_both(tf, f, x)
            np.testing.assert_array_equal(g.numpy(), c.numpy())


def test_in_top_k(tf):
    """InTopKV2 (top-k accuracy): targets out of range or with a non-finite prediction are
    false, ties count as in (only strictly larger predictions push a target out), NaN
    predictions of other classes never count; int32 and int64 targets; every k."""
    rng = np.random.default_rng(3)
    p = rng.standard_normal((9, 7)).astype(np.float32)
    p[0, 3] = np.nan
    p[1, :] = 1.0
    p[2, 2] = np.inf
    t = np.array([3, 0, 2, 6, 7, -1, 1, 2, 3])
    for k in [0, 1, 2, 3, 7, 10]:
        for idt in (np.int32, np.int64):
            with ran_on_gpu("InTopKV2"):
                g, c = run_both(tf, lambda tt, pp: tf.math.in_top_k(tt, pp, k), t.astype(idt), p)
            np.testing.assert_array_equal(g.numpy(), c.numpy())
    # Many classes: counted in chunks of 32,768.
    big = rng.standard_normal((3, 70000)).astype(np.float32)
    tt = np.array([5, 69999, 40000], np.int32)
    g, c = run_both(tf, lambda a, b: tf.math.in_top_k(a, b, 30000), tt, big)
    np.testing.assert_array_equal(g.numpy(), c.numpy())


def test_keras_auc_and_top_k_metrics_stay_on_the_gpu(tf):
    """Keras's AUC (Cumsum over its thresholds) and top-k accuracy (InTopKV2) run on the GPU:
    they went to the CPU, with the predictions, every step."""
    import keras
    import tensorflow_wgpu

    rng = np.random.default_rng(4)
    x = rng.standard_normal((32, 8)).astype(np.float32)
    y = rng.integers(0, 4, 32).astype(np.int32)
    with tf.device("/GPU:0"):
        keras.utils.set_random_seed(5)
        m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
        m.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.SparseTopKCategoricalAccuracy(2)],
            jit_compile=False,
        )
        m2 = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1, activation="sigmoid")])
        m2.compile(optimizer="adam", loss="binary_crossentropy", metrics=[keras.metrics.AUC()], jit_compile=False)
        before = tensorflow_wgpu.stats()["gpu_ops"]
        m.fit(x, y, batch_size=8, epochs=1, verbose=0)
        m2.fit(x, (y % 2).astype(np.float32)[:, None], batch_size=8, epochs=1, verbose=0)
        after = tensorflow_wgpu.stats()["gpu_ops"]
    for op in ("InTopKV2", "Cumsum"):
        assert after.get(op, 0) > before.get(op, 0), op
