"""Memory-bound kernels changed for speed (issue 6) through TensorFlow: Softmax / LogSoftmax
(rows read once, vec4 loads when the row length is a multiple of 4), Sum / Max / Mean over
the last and first axes (vec4 loads), elementwise binary ops with vec4 loads (same shapes and
row-vector broadcasts), FusedBatchNormV3 (statistics without a division per element, the
[C] outputs written by the finalize pass) and device-to-device copies. Each on /GPU:0
against /CPU:0, forward and gradients; the plugin's counters show the ops ran on the GPU."""
import numpy as np
import pytest

from test_ops_conv import ran
from test_ops_poolnorm import RanOnGpu, assert_near, gpu_ops, on

rng = np.random.default_rng(6)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape", [(3, 8), (5, 1000), (2, 4096), (2, 4100), (3, 1025), (4, 7), (2, 3, 12), (1, 1),
                                   # One row per 1024-invocation workgroup (subgroup reductions).
                                   (2, 32768)])
def test_softmax_rows(tf, op, shape):
    x = rng.uniform(-20, 20, shape).astype(np.float32)
    fn = getattr(tf.nn, "softmax" if op == "Softmax" else "log_softmax")

    def run(v):
        with tf.GradientTape() as t:
            t.watch(v)
            y = fn(v)
            w = tf.reshape(tf.cast(tf.range(tf.size(y)) % 5, tf.float32), tf.shape(y))
            loss = tf.reduce_sum(y * w)
        return y, t.gradient(loss, v)

    with RanOnGpu(op):
        yg, gg = on(tf, "/GPU:0", run, x)
    yc, gc = on(tf, "/CPU:0", run, x)
    assert_near(yg, yc, 2e-5, 1e-6)
    assert_near(gg, gc, 1e-4, 1e-5)


def _softmax_f64(x, log):
    """Softmax by its formula in float64: max (NaN propagates), exp(x - max), sum, divide."""
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        z = x - x.max(axis=-1, keepdims=True)
        s = np.exp(z).sum(axis=-1, keepdims=True)
        return z - np.log(s) if log else np.exp(z) / s


def test_softmax_special_values(tf):
    inf, nan = np.inf, np.nan
    x = np.array(
        [[-inf, -inf, 1, 2], [1, -inf, 2, -inf], [nan, 1, 2, 3], [1, 2, 3, inf], [-inf] * 4],
        np.float32,
    )
    # TensorFlow's CPU kernel gives rows holding NaN or +inf different answers on different
    # CPUs (on an AVX-512 machine softmax([nan, 1, 2, 3]) = [nan, 0, 0, 0], elsewhere all NaN):
    # those rows are checked against the formula (all NaN), the others against the CPU kernel.
    special = (np.isnan(x) | (x == inf)).any(axis=1)
    for fn, log in ((tf.nn.softmax, False), (tf.nn.log_softmax, True)):
        g = on(tf, "/GPU:0", fn, x).numpy()
        c = on(tf, "/CPU:0", fn, x).numpy()
        want = _softmax_f64(x, log)
        assert np.isnan(want[special]).all()
        np.testing.assert_array_equal(np.isnan(g[special]), np.isnan(want[special]))
        g, c = g[~special], c[~special]
        np.testing.assert_array_equal(np.isnan(g), np.isnan(c))
        ok = ~np.isnan(c)
        assert_near(g[ok], c[ok], 1e-6, 1e-7)


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_max", "reduce_mean"])
@pytest.mark.parametrize(
    "shape,axis", [((64, 1028), 1), ((1028, 64), 0), ((3, 500, 32), 1), ((2, 65536), 1), ((37, 9), 0)]
)
def test_reductions(tf, op, shape, axis):
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    name = {"reduce_sum": "Sum", "reduce_max": "Max", "reduce_mean": "Mean"}[op]
    fn = getattr(tf, op)
    with RanOnGpu(name):
        g = on(tf, "/GPU:0", lambda v: fn(v, axis=axis), x)
    c = on(tf, "/CPU:0", lambda v: fn(v, axis=axis), x)
    assert_near(g, c, 0 if op == "reduce_max" else 2e-5, 0 if op == "reduce_max" else 1e-5)
    xi = rng.integers(-1000, 1000, shape).astype(np.int32)
    if op != "reduce_mean":
        g = on(tf, "/GPU:0", lambda v: fn(v, axis=axis), xi)
        c = on(tf, "/CPU:0", lambda v: fn(v, axis=axis), xi)
        np.testing.assert_array_equal(g, c)


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"])
@pytest.mark.parametrize(
    "shape,axis", [((64, 1028), 1), ((1028, 64), 0), ((3, 500, 32), [0, 2]), ((4, 7, 7, 24), [1, 2]), ((5, 0), 1)]
)
def test_float16_reductions(tf, op, shape, axis):
    """float16 reductions (Keras's mixed precision: global average pooling, statistics) on the
    GPU: reduced in float32 and rounded once, as TensorFlow's GPU kernels accumulate half in
    float; against float64 reductions of the same halves, within one float16 rounding (2^-11
    relative; sums near zero also within the float32 sum's error)."""
    lo, hi = (0.95, 1.05) if op == "reduce_prod" else (-1, 1)
    x = rng.uniform(lo, hi, shape).astype(np.float16)
    name = {"reduce_sum": "Sum", "reduce_mean": "Mean", "reduce_max": "Max", "reduce_min": "Min", "reduce_prod": "Prod"}[op]
    fn = getattr(tf, op)
    with RanOnGpu(name):
        g = np.asarray(on(tf, "/GPU:0", lambda v: fn(v, axis=axis), x))
    assert g.dtype == np.float16
    want = getattr(np, {"reduce_sum": "sum", "reduce_mean": "mean", "reduce_max": "max", "reduce_min": "min", "reduce_prod": "prod"}[op])
    if x.size == 0 and op in ("reduce_max", "reduce_min"):
        ref = np.full(g.shape, -np.inf if op == "reduce_max" else np.inf)
    else:
        with np.errstate(invalid="ignore"):
            ref = want(x.astype(np.float64), axis=tuple(np.atleast_1d(axis)))
    ref16 = ref.astype(np.float16)
    if op in ("reduce_max", "reduce_min"):
        np.testing.assert_array_equal(g, ref16)
    else:
        np.testing.assert_allclose(g.astype(np.float64), ref, rtol=2.0**-11, atol=1e-5, equal_nan=True)


def test_float16_reductions_past_a_float32_copy(tf):
    """A float16 tensor of 2^25 + 12 elements (64 MiB): a float32 copy of it (128 MiB) would
    not fit one storage binding of a 128 MiB adapter (lavapipe), so the first pass reads the
    halves itself. Sum within one half rounding plus the float32 sum's error of float64's;
    Max exact."""
    n = 2**25 + 12
    x = np.random.default_rng(5).uniform(-1, 1, n).astype(np.float16)
    x[n - 3] = 7.5
    with RanOnGpu("Sum"):
        total = float(np.asarray(on(tf, "/GPU:0", lambda v: tf.reduce_sum(v), x)))
    with RanOnGpu("Max"):
        top = float(np.asarray(on(tf, "/GPU:0", lambda v: tf.reduce_max(v), x)))
    x64 = x.astype(np.float64)
    want = x64.sum()
    tol = abs(want) * 2.0**-11 + (2 * 26 + 32) * 2.0**-24 * np.abs(x64).sum()
    assert abs(total - want) <= tol, (total, want, tol)
    assert top == 7.5


@pytest.mark.parametrize("op", ["add", "multiply", "maximum", "subtract"])
@pytest.mark.parametrize(
    "sa,sb", [((6, 8), (8,)), ((8,), (6, 8)), ((5, 12), (5, 12)), ((3, 4), (3, 4)), ((2, 3, 8), (8,))]
)
def test_binary_vec4(tf, op, sa, sb):
    a = rng.uniform(-5, 5, sa).astype(np.float32)
    b = rng.uniform(-5, 5, sb).astype(np.float32)
    a.flat[0] = np.nan
    fn = getattr(tf.math, op)

    def run(x, y):
        with tf.GradientTape() as t:
            t.watch([x, y])
            z = fn(x, y)
            loss = tf.reduce_sum(z * z)
        return (z,) + tuple(t.gradient(loss, [x, y]))

    g = on(tf, "/GPU:0", run, a, b)
    c = on(tf, "/CPU:0", run, a, b)
    for u, v in zip(g, c):
        np.testing.assert_array_equal(u.numpy(), v.numpy())
    ai = rng.integers(-1000, 1000, sa).astype(np.int32)
    bi = rng.integers(-1000, 1000, sb).astype(np.int32)
    np.testing.assert_array_equal(on(tf, "/GPU:0", fn, ai, bi), on(tf, "/CPU:0", fn, ai, bi))


@pytest.mark.parametrize("shape", [(4, 5, 6, 8), (2, 3, 3, 7), (32, 2, 2, 64)])
@pytest.mark.parametrize("training", [True, False])
def test_fused_batch_norm_v3(tf, shape, training):
    c = shape[-1]
    x = (rng.uniform(-1, 1, shape) + 3).astype(np.float32)
    scale = rng.uniform(0.5, 2, c).astype(np.float32)
    offset = rng.uniform(-1, 1, c).astype(np.float32)
    mean = rng.uniform(-1, 1, c).astype(np.float32)
    var = rng.uniform(0.5, 2, c).astype(np.float32)

    def run(xv, s, o, m, v):
        with tf.GradientTape() as t:
            t.watch([xv, s, o])
            outs = tf.raw_ops.FusedBatchNormV3(
                x=xv, scale=s, offset=o, mean=m, variance=v, epsilon=1e-3,
                exponential_avg_factor=1.0, is_training=training,
            )
            loss = tf.reduce_sum(outs[0] * outs[0])
        return outs[:5] + tuple(t.gradient(loss, [xv, s, o]))

    with RanOnGpu("FusedBatchNormV3"):
        g = on(tf, "/GPU:0", run, x, scale, offset, mean, var)
    cpu = on(tf, "/CPU:0", run, x, scale, offset, mean, var)
    # Inference: TensorFlow's CPU kernel leaves reserve_space_1/2 (outputs 3, 4) uninitialized.
    keep = range(8) if training else [0, 1, 2, 5, 6, 7]
    for k in keep:
        assert_near(g[k], cpu[k], 2e-4, 2e-4)


# float16 <-> float32 Cast: 8 elements per invocation when the count is a multiple of 8, else
# one word per invocation; bit for bit against the CPU (NaN: any NaN), with ties, subnormals,
# overflow to infinity, infinities and NaN among the values.
@pytest.mark.parametrize("n", [4096, 4095, 8, 1])
def test_cast_float16_both_ways(tf, n):
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = np.resize(rng.permutation(halves), n)
    specials = np.array([2049.0, 2051.0, 65519.99, 65520.0, 1e-8, 2.98e-8, 3.0e-8, 6.0e-5,
                         -0.0, np.inf, -np.inf, np.nan, 1.0 + 2.0 ** -11, 1e6], np.float32)
    f = np.resize(np.concatenate([specials, rng.uniform(-70000, 70000, n).astype(np.float32)]), n)
    for src, dst in ((h, tf.float32), (f, tf.float16)):
        with RanOnGpu("Cast"):
            g = on(tf, "/GPU:0", lambda v: tf.cast(v, dst), src)
        c = on(tf, "/CPU:0", lambda v: tf.cast(v, dst), src)
        g, c = g.numpy(), c.numpy()
        nan = np.isnan(c)
        np.testing.assert_array_equal(np.isnan(g), nan)
        np.testing.assert_array_equal(g[~nan].view(np.uint16 if dst == tf.float16 else np.uint32),
                                      c[~nan].view(np.uint16 if dst == tf.float16 else np.uint32))


# float16 binary ops on vec4 words of 8 halves (same shapes and row vectors of a multiple of
# 8), and on one word per invocation otherwise; gradients through the same kernels.
@pytest.mark.parametrize("op", ["add", "multiply", "maximum", "subtract"])
@pytest.mark.parametrize("sa,sb", [((6, 16), (16,)), ((16,), (6, 16)), ((5, 24), (5, 24)), ((3, 5), (3, 5))])
def test_binary_float16(tf, op, sa, sb):
    a = rng.uniform(-300, 300, sa).astype(np.float16)
    b = rng.uniform(-300, 300, sb).astype(np.float16)
    a.flat[0] = np.nan
    a.flat[1] = np.inf
    a.flat[2] = 60000
    fn = getattr(tf.math, op)

    def run(x, y):
        with tf.GradientTape() as t:
            t.watch([x, y])
            z = fn(x, y)
            loss = tf.reduce_sum(tf.cast(z, tf.float32))
        return (z,) + tuple(t.gradient(loss, [x, y]))

    with RanOnGpu({"add": "AddV2", "multiply": "Mul", "maximum": "Maximum", "subtract": "Sub"}[op]):
        g = on(tf, "/GPU:0", run, a, b)
    c = on(tf, "/CPU:0", run, a, b)
    for k, (u, v) in enumerate(zip(g, c)):
        u, v = u.numpy(), v.numpy()
        rows = (np.prod(sa) if k == 2 else np.prod(sb)) // u.size
        if k == 0 or rows == 1:
            np.testing.assert_array_equal(u, v)
            continue
        # The broadcast operand's gradient sums `rows` float16 products: the GPU adds them in
        # float32 and rounds once (TensorFlow's GPU kernels), the CPU adds in half, rounding
        # each step: within (rows + 1) roundings of 2^-11 of the terms' magnitude.
        other = np.asarray(b if k == 1 else a, np.float64)
        mag = np.abs(other if op == "multiply" else np.ones_like(other))
        bound = (rows + 1) * 2.0**-11 * np.sum(np.broadcast_to(mag, np.broadcast_shapes(sa, sb)).reshape(-1, u.size), 0)
        np.testing.assert_array_equal(np.isnan(u), np.isnan(v))
        ok = np.isfinite(v.astype(np.float64))
        assert np.all(np.abs(u[ok].astype(np.float64) - v[ok].astype(np.float64)) <= bound.reshape(u.shape)[ok]), (u, v)


def test_device_copies(tf):
    # tf.identity across a tf.function boundary and concat/slices produce device copies;
    # large tensors land in buffers of their own.
    x = rng.uniform(-1, 1, (3, 300, 1000)).astype(np.float32)
    with tf.device("/GPU:0"):
        t = tf.constant(x)
        y = tf.identity(t)
        z = tf.concat([y[:, 1:], y[:, :1]], axis=1)
    np.testing.assert_array_equal(z.numpy(), np.concatenate([x[:, 1:], x[:, :1]], axis=1))


@pytest.mark.parametrize("mode", ["", "concat"])
def test_loss_scale_finite_check_on_the_gpu(tf, mode, monkeypatch):
    """Keras's LossScaleOptimizer.check_finite on tfwgpu GPUs (the hook's one fused reduction per
    gradient): the same answer as Keras's own check on the CPU for finite gradients, an inf, a
    -inf and a NaN in any one of them (float32, float16, IndexedSlices, an int gradient); on the
    GPU no All kernel and one IsFinite per check (of the total), not one per gradient. With
    `TFWGPU_FINITE_CHECK=concat`, the gradients concatenated and reduced once."""
    import keras

    monkeypatch.setenv("TFWGPU_FINITE_CHECK", mode)

    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    base = [
        rng.standard_normal((64, 33)).astype(np.float32),
        rng.standard_normal((7,)).astype(np.float16),
        rng.standard_normal((5, 4)).astype(np.float32),
    ]

    def grads(where, bad):
        out = [b.copy() for b in base]
        if where is not None:
            out[where].flat[where * 3 + 1] = bad
        return out

    def check(dev, gs):
        with tf.device(dev):
            @tf.function
            def f(a, b, c):
                sl = tf.IndexedSlices(c, tf.constant([0, 2, 3, 6, 9]), tf.constant([10, 4]))
                return opt.check_finite([a, None, b, sl, tf.constant([1, 2])])
            return bool(f(*[tf.constant(g) for g in gs]))

    before = gpu_ops()
    cases = [(None, 0.0)] + [(w, v) for w in range(3) for v in (np.inf, -np.inf, np.nan)]
    for where, bad in cases:
        gs = grads(where, bad)
        want = check("/CPU:0", gs)
        assert want == (where is None), (where, bad)
        assert check("/GPU:0", gs) == want, (where, bad)
    assert ran(before, "IsFinite") == len(cases) and ran(before, "All") == 0, gpu_ops()

    # A filter gradient computed in the same graph (its shape a constant of the graph, where
    # TensorFlow's constant folding could simplify arithmetic with zeros).
    def conv_check(dev, x):
        with tf.device(dev):
            w = tf.constant(rng.standard_normal((3, 3, 2, 4)).astype(np.float32))

            @tf.function
            def f(x):
                with tf.GradientTape() as t:
                    t.watch(w)
                    loss = tf.reduce_sum(tf.nn.conv2d(x, w, 1, "SAME"))
                return opt.check_finite([t.gradient(loss, w)])
            return bool(f(tf.constant(x)))

    x = rng.standard_normal((2, 6, 6, 2)).astype(np.float32)
    for bad in (None, np.inf, np.nan):
        xb = x.copy()
        if bad is not None:
            xb[1, 2, 3, 1] = bad
        want = conv_check("/CPU:0", xb)
        assert want == (bad is None), bad
        assert conv_check("/GPU:0", xb) == want, bad


def test_mixed_precision_fit_skips_steps_with_non_finite_gradients(tf):
    """Keras mixed precision on the GPU: a huge initial loss scale overflows the float16
    gradients, the optimizer skips those steps and halves the scale (Keras's rule) until the
    gradients are finite; the weights then train as on the CPU."""
    import keras

    x = rng.standard_normal((32, 8)).astype(np.float32)
    y = rng.standard_normal((32, 1)).astype(np.float32)
    out = {}
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        for dev in ["/CPU:0", "/GPU:0"]:
            with tf.device(dev):
                keras.utils.set_random_seed(7)
                m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                                      keras.layers.Dense(1, dtype="float32")])
                opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01),
                                                          initial_scale=2.0**40)
                m.compile(optimizer=opt, loss="mse", jit_compile=False)
                w0 = [w.numpy() for w in m.weights]
                m.fit(x, y, batch_size=32, epochs=30, verbose=0, shuffle=False)
                out[dev] = (float(opt.dynamic_scale.numpy()), [w.numpy() for w in m.weights], w0)
    finally:
        keras.mixed_precision.set_global_policy(policy)
    (scale_c, w_c, w0_c), (scale_g, w_g, w0_g) = out["/CPU:0"], out["/GPU:0"]
    assert scale_g == scale_c < 2.0**40, (scale_g, scale_c)
    for a, b, a0 in zip(w_g, w_c, w0_c):
        assert not np.array_equal(a, a0)  # it trained after the skipped steps
        np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-3)
