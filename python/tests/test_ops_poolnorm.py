"""pool and norm families through TensorFlow: each op on /GPU:0 against /CPU:0 (forward and
gradients through tf.GradientTape), and the Keras pooling / normalization layers. The plugin's
kernel counters (tfwgpu_stats_json) show which ops really ran on the GPU."""
import contextlib
import ctypes
import json

import numpy as np
import pytest

from conftest import on_gpu


def gpu_ops():
    import tensorflow_wgpu

    lib = tensorflow_wgpu._plugin()
    lib.tfwgpu_stats_json.restype = ctypes.c_char_p
    return json.loads(lib.tfwgpu_stats_json().decode())["gpu_ops"]


class RanOnGpu:
    """Asserts that each of `ops` ran at least once on the GPU inside the block."""

    def __init__(self, *ops):
        self.ops = ops

    def __enter__(self):
        self.before = gpu_ops()
        return self

    def __exit__(self, *exc):
        if exc[0] is not None:
            return False
        after = gpu_ops()
        self.ran = {k: v - self.before.get(k, 0) for k, v in after.items() if v > self.before.get(k, 0)}
        for op in self.ops:
            assert self.ran.get(op, 0) > 0, f"{op} did not run on the GPU (ran: {sorted(self.ran)})"
        return False


def on(tf, device, fn, *arrays):
    with tf.device(device):
        return fn(*[tf.constant(a) for a in arrays])


def assert_near(g, c, rtol, atol=None):
    g = np.asarray(g, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    assert g.shape == c.shape
    if rtol == 0:
        np.testing.assert_array_equal(g, c)
    else:
        np.testing.assert_allclose(g, c, rtol=rtol, atol=rtol if atol is None else atol)


rng = np.random.default_rng(0)

# (input shape, ksize, strides, padding): odd sizes, overhanging SAME windows, strides > ksize,
# channel counts that are not multiples of 4.
POOL_CASES = [
    ((2, 7, 5, 3), 2, 2, "SAME"),
    ((1, 9, 8, 5), 3, 2, "SAME"),
    ((3, 4, 6, 2), (3, 2), 1, "VALID"),
    ((1, 5, 11, 7), 2, (3, 4), "SAME"),
    ((2, 6, 6, 1), 4, 3, "VALID"),
    # NHWC with C % 4 == 0: the four-channel kernels (MaxPoolGrad through argmax codes).
    ((2, 9, 8, 8), 3, 2, "SAME"),
    ((1, 7, 6, 4), 2, (1, 2), "VALID"),
    # Strides 2 x 2, windows up to 4 x 4: MaxPoolGrad's gather per 2 x 2 block of inputs.
    ((2, 8, 9, 8), 3, 2, "VALID"),
    ((1, 7, 7, 12), (4, 1), 2, "SAME"),
    # float16 with C % 8 == 0: eight channels per invocation (three octets).
    ((1, 9, 9, 24), 3, 2, "SAME"),
]


def pool_grads(tf, pool, x, dtype, k, s, pad, fmt="NHWC"):
    x = tf.constant(x, dtype=dtype)
    with tf.GradientTape() as t:
        t.watch(x)
        y = pool(x, k, s, pad, data_format=fmt)
        w = tf.reshape(tf.cast(tf.range(tf.size(y)) % 7, dtype) / 7, tf.shape(y))
        loss = tf.reduce_sum(y * w)
    return y, t.gradient(loss, x)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape,k,s,pad", POOL_CASES)
def test_max_pool_and_gradient(tf, dtype, shape, k, s, pad):
    # Small integers: many ties, which must route the gradient to TensorFlow's argmax.
    x = rng.integers(-3, 4, shape).astype(dtype)
    with RanOnGpu("MaxPool", "MaxPoolGrad"):
        with tf.device("/GPU:0"):
            gy, gdx = pool_grads(tf, tf.nn.max_pool2d, x, dtype, k, s, pad)
    with tf.device("/CPU:0"):
        cy, cdx = pool_grads(tf, tf.nn.max_pool2d, x, dtype, k, s, pad)
    assert on_gpu(gy) and on_gpu(gdx)
    assert_near(gy, cy, 0)
    assert_near(gdx, cdx, 0)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape,k,s,pad", POOL_CASES)
def test_avg_pool_and_gradient(tf, dtype, shape, k, s, pad):
    x = rng.uniform(-2, 2, shape).astype(dtype)
    with RanOnGpu("AvgPool", "AvgPoolGrad"):
        with tf.device("/GPU:0"):
            gy, gdx = pool_grads(tf, tf.nn.avg_pool2d, x, dtype, k, s, pad)
    with tf.device("/CPU:0"):
        cy, cdx = pool_grads(tf, tf.nn.avg_pool2d, x, dtype, k, s, pad)
    assert on_gpu(gy) and on_gpu(gdx)
    # Same summation order as TensorFlow's CPU kernels; only the division may differ by an ulp.
    rtol = 1e-3 if dtype == "float16" else 1e-6
    assert_near(gy, cy, rtol)
    assert_near(gdx, cdx, rtol)


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_nchw_on_gpu_matches_nhwc_on_cpu(tf, pool):
    fn = tf.nn.max_pool2d if pool == "max" else tf.nn.avg_pool2d
    x = rng.integers(-3, 4, (2, 7, 5, 3)).astype("float32")
    with tf.device("/GPU:0"):
        gy, gdx = pool_grads(tf, fn, np.transpose(x, (0, 3, 1, 2)), "float32", 3, 2, "SAME", "NCHW")
    with tf.device("/CPU:0"):
        cy, cdx = pool_grads(tf, fn, x, "float32", 3, 2, "SAME")
    # The loss weights follow the flat index, which differs between layouts: compare y, and
    # dx of a layout-independent loss.
    assert_near(np.transpose(gy.numpy(), (0, 2, 3, 1)), cy, 0 if pool == "max" else 1e-6)
    xg = tf.constant(np.transpose(x, (0, 3, 1, 2)))
    with tf.device("/GPU:0"):
        with tf.GradientTape() as t:
            t.watch(xg)
            loss = tf.reduce_sum(fn(xg, 3, 2, "SAME", data_format="NCHW") ** 2)
        gdx = t.gradient(loss, xg)
    xc = tf.constant(x)
    with tf.device("/CPU:0"):
        with tf.GradientTape() as t:
            t.watch(xc)
            loss = tf.reduce_sum(fn(xc, 3, 2, "SAME") ** 2)
        cdx = t.gradient(loss, xc)
    assert on_gpu(gdx)
    assert_near(np.transpose(gdx.numpy(), (0, 2, 3, 1)), cdx, 1e-6)


def test_max_pool_ties_and_nan_match_cpu(tf):
    nan = np.nan
    windows = [
        [1, 1, 1, 1],
        [nan, 1, 2, 3],
        [1, nan, 2, 3],
        [1, 2, 3, nan],
        [nan, nan, 1, 2],
        [nan, nan, nan, nan],
        [-np.inf] * 4,
        [0, 2, 2, 1],
    ]
    for dtype in ("float32", "float16"):
        x = np.array(windows, dtype).reshape(len(windows), 2, 2, 1)
        with tf.device("/GPU:0"):
            gy, gdx = pool_grads(tf, tf.nn.max_pool2d, x, dtype, 2, 2, "VALID")
        with tf.device("/CPU:0"):
            cy, cdx = pool_grads(tf, tf.nn.max_pool2d, x, dtype, 2, 2, "VALID")
        assert on_gpu(gy)
        want = cy.numpy()
        if dtype == "float16":
            # Windows of only NaN and -inf: Eigen's kernel gives the lowest finite half (as the
            # GPU does); TensorFlow's CPU takes oneDNN's pooling instead on CPUs with AVX-512
            # FP16, which gives -inf.
            want = np.where(np.isneginf(want), np.float16(-65504), want)
        np.testing.assert_array_equal(gy.numpy(), want)
        np.testing.assert_array_equal(gdx.numpy(), cdx.numpy())


def test_max_pool_v2_grad_grad_and_raw_ops(tf):
    x = rng.integers(-3, 4, (2, 7, 6, 3)).astype("float32")
    g = rng.uniform(-1, 1, (2, 4, 3, 3)).astype("float32")
    gg = rng.uniform(-1, 1, x.shape).astype("float32")
    k, s = [1, 3, 2, 1], [1, 2, 2, 1]

    def ops(x, g, gg):
        y = tf.raw_ops.MaxPoolV2(input=x, ksize=k, strides=s, padding="SAME")
        dx = tf.raw_ops.MaxPoolGradV2(orig_input=x, orig_output=y, grad=g, ksize=k, strides=s, padding="SAME")
        ddy = tf.raw_ops.MaxPoolGradGrad(orig_input=x, orig_output=y, grad=gg, ksize=k, strides=s, padding="SAME")
        ddy2 = tf.raw_ops.MaxPoolGradGradV2(orig_input=x, orig_output=y, grad=gg, ksize=k, strides=s, padding="SAME")
        return y, dx, ddy, ddy2

    with RanOnGpu("MaxPoolV2", "MaxPoolGradV2", "MaxPoolGradGrad", "MaxPoolGradGradV2"):
        gres = on(tf, "/GPU:0", ops, x, g, gg)
    cres = on(tf, "/CPU:0", ops, x, g, gg)
    for a, b in zip(gres, cres):
        assert on_gpu(a)
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_max_pool_second_order_gradient(tf):
    x = rng.integers(-3, 4, (1, 5, 5, 2)).astype("float32")

    def second(x):
        with tf.GradientTape() as t2:
            t2.watch(x)
            with tf.GradientTape() as t1:
                t1.watch(x)
                y = tf.nn.max_pool2d(x, 2, 1, "SAME")
                inner = tf.reduce_sum(y * y)
            dx = t1.gradient(inner, x)
            loss = tf.reduce_sum(dx * x)
        return t2.gradient(loss, x)

    with RanOnGpu("MaxPool", "MaxPoolGrad", "MaxPoolGradGrad"):
        g = on(tf, "/GPU:0", second, x)
    c = on(tf, "/CPU:0", second, x)
    assert on_gpu(g)
    np.testing.assert_array_equal(g.numpy(), c.numpy())


def fbn(tf, x, scale, offset, mean, var, training, fmt, factor=1.0):
    """fused_batch_norm forward and gradients with respect to x, scale and offset."""
    with tf.GradientTape() as t:
        t.watch([x, scale, offset])
        y, bm, bv = tf.compat.v1.nn.fused_batch_norm(
            x, scale, offset, mean=mean, variance=var, epsilon=1e-3, data_format=fmt,
            is_training=training, exponential_avg_factor=factor,
        )
        w = tf.cast(tf.reshape(tf.range(tf.size(y)) % 5, tf.shape(y)), y.dtype)
        loss = tf.reduce_sum(tf.cast(y * w, tf.float32))
    dx, ds, do = t.gradient(loss, [x, scale, offset])
    return y, bm, bv, dx, ds, do


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("training,factor", [(True, 1.0), (True, 0.3), (False, 1.0)])
@pytest.mark.parametrize("shape,fmt", [((2, 5, 3, 7), "NHWC"), ((3, 6, 4, 5), "NCHW"), ((1, 1, 1, 3), "NHWC"),
                                       # C % 4 == 0, NHWC: the vec4 statistics and apply.
                                       ((2, 9, 7, 8), "NHWC"), ((1, 5, 3, 12), "NHWC"),
                                       # Training in one dispatch with 2 and 8 channel quads
                                       # per workgroup (the last one partly empty); rows enough
                                       # per channel that no channel's variance is tiny (3 rows
                                       # make dx ill-conditioned for any kernel).
                                       ((2, 3, 4, 2052), "NHWC"), ((1, 2, 4, 8196), "NHWC")])
def test_fused_batch_norm(tf, dtype, training, shape, fmt, factor):
    c = shape[3] if fmt == "NHWC" else shape[1]
    x = rng.normal(0.5, 2.0, shape).astype(dtype)
    scale = rng.uniform(0.5, 2, c).astype("float32")
    offset = rng.uniform(-1, 1, c).astype("float32")
    mean = rng.uniform(-1, 1, c).astype("float32")
    var = rng.uniform(0.5, 2, c).astype("float32")
    if training and factor == 1.0:
        mean_arg = var_arg = None
    else:
        mean_arg, var_arg = mean, var

    def run(device):
        with tf.device(device):
            args = [tf.constant(a) for a in (x, scale, offset)]
            m = None if mean_arg is None else tf.constant(mean_arg)
            v = None if var_arg is None else tf.constant(var_arg)
            return fbn(tf, *args, m, v, training, fmt, factor)

    with RanOnGpu("FusedBatchNormV3", "FusedBatchNormGradV3"):
        g = run("/GPU:0")
    c_ = run("/CPU:0")
    names = ["y", "batch_mean", "batch_variance", "dx", "dscale", "doffset"]
    for name, a, b in zip(names, g, c_):
        # With is_training false and NCHW, TensorFlow's Python gradient transposes x and dy to
        # NHWC around FusedBatchNormGradV3, and Transpose is not a tfwgpu kernel: dx comes back
        # from the CPU there (the gradient op itself ran on the GPU, RanOnGpu checks that).
        if not (name == "dx" and fmt == "NCHW" and not training):
            assert on_gpu(a), name
        if dtype == "float16" and name in ("y", "dx"):
            rtol, atol = 2e-3, 2e-3
        elif name in ("dscale", "doffset"):
            rtol, atol = 1e-5, 1e-4
        else:
            rtol, atol = 2e-5, 2e-5
        try:
            assert_near(a, b, rtol, atol)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


def test_keras_pooling_layers(tf):
    import keras

    x = rng.uniform(-2, 2, (3, 9, 7, 5)).astype("float32")
    layers = {
        "MaxPooling2D": (lambda: keras.layers.MaxPooling2D(3, 2, padding="same"), ("MaxPool", "MaxPoolGrad"), 0),
        "AveragePooling2D": (lambda: keras.layers.AveragePooling2D(2, 2, padding="valid"), ("AvgPool", "AvgPoolGrad"), 1e-6),
        "GlobalAveragePooling2D": (lambda: keras.layers.GlobalAveragePooling2D(), ("Mean",), 1e-6),
    }
    for name, (make, ops, rtol) in layers.items():
        layer = make()

        def fwd_bwd(x):
            with tf.GradientTape() as t:
                t.watch(x)
                y = layer(x)
                loss = tf.reduce_sum(y * y)
            return y, t.gradient(loss, x)

        with RanOnGpu(*ops):
            gy, gdx = on(tf, "/GPU:0", fwd_bwd, x)
        cy, cdx = on(tf, "/CPU:0", fwd_bwd, x)
        assert on_gpu(gy) and on_gpu(gdx), name
        assert_near(gy, cy, rtol)
        assert_near(gdx, cdx, max(rtol, 1e-6))


def test_keras_batch_normalization_layer(tf):
    """Keras 3's BatchNormalization on the TensorFlow backend computes moments (tf.nn.moments:
    Mean, SquaredDifference) and tf.nn.batch_normalization (Rsqrt, Mul, Sub, AddV2) rather
    than calling FusedBatchNorm; it must still match the CPU, in training and inference."""
    import keras

    x = rng.normal(1.0, 3.0, (4, 5, 3, 6)).astype("float32")

    def make():
        keras.utils.set_random_seed(3)
        layer = keras.layers.BatchNormalization(momentum=0.9)
        layer.build(x.shape)
        return layer

    results = {}
    for device in ("/GPU:0", "/CPU:0"):
        with tf.device(device):
            layer = make()
            xt = tf.constant(x)

            @tf.function
            def step(xt, training):
                with tf.GradientTape() as t:
                    t.watch(xt)
                    y = layer(xt, training=training)
                    loss = tf.reduce_sum(y * y)
                return y, t.gradient(loss, [xt] + layer.trainable_weights)

            before = gpu_ops()
            out = [step(xt, True), step(xt, False)]
            ran = {k for k, v in gpu_ops().items() if v > before.get(k, 0)}
            graph_ops = {n.op for n in step.get_concrete_function(xt, True).graph.as_graph_def().node}
            results[device] = (out, [w.numpy() for w in layer.non_trainable_weights], ran, graph_ops)
    (g, gstats, gran, gops), (c, cstats, _, _) = results["/GPU:0"], results["/CPU:0"]
    print("Keras BatchNormalization graph ops:", sorted(gops), "ran on GPU:", sorted(gran))
    assert not any(op.startswith("FusedBatchNorm") for op in gops), sorted(gops)
    assert {"Mean", "SquaredDifference", "Rsqrt"} <= gops, sorted(gops)
    # Rsqrt runs on the GPU by itself or inside a fused elementwise kernel (the plugin's graph
    # pass fuses it with its neighbours unless TFWGPU_FUSION=0).
    fused = {"_TfwgpuFusedElementwise", "_TfwgpuFusedElementwiseMulti"}
    assert "Mean" in gran and ({"Rsqrt"} | fused) & gran, sorted(gran)
    for (gy, ggrads), (cy, cgrads) in zip(g, c):
        assert on_gpu(gy)
        assert_near(gy, cy, 1e-5)
        for a, b in zip(ggrads, cgrads):
            assert_near(a, b, 1e-4, 1e-4)
    for a, b in zip(gstats, cstats):
        assert_near(a, b, 1e-5)


@pytest.mark.parametrize("version", ["", "V2"])
def test_fused_batch_norm_v1_v2_raw_ops(tf, version):
    x = rng.normal(0.0, 1.5, (2, 4, 3, 5)).astype("float32")
    dy = rng.uniform(-1, 1, x.shape).astype("float32")
    scale = rng.uniform(0.5, 2, 5).astype("float32")
    offset = rng.uniform(-1, 1, 5).astype("float32")
    fwd = getattr(tf.raw_ops, "FusedBatchNorm" + version)
    bwd = getattr(tf.raw_ops, "FusedBatchNormGrad" + version)

    def ops(x, dy, scale, offset):
        empty = tf.constant([], tf.float32)
        y, bm, bv, r1, r2 = fwd(x=x, scale=scale, offset=offset, mean=empty, variance=empty, epsilon=1e-3, is_training=True)
        dx, ds, do, _, _ = bwd(
            y_backprop=dy, x=x, scale=scale, reserve_space_1=r1, reserve_space_2=r2, epsilon=1e-3, is_training=True
        )
        return y, bm, bv, r1, r2, dx, ds, do

    with RanOnGpu("FusedBatchNorm" + version, "FusedBatchNormGrad" + version):
        g = on(tf, "/GPU:0", ops, x, dy, scale, offset)
    c = on(tf, "/CPU:0", ops, x, dy, scale, offset)
    for a, b in zip(g, c):
        assert on_gpu(a)
        assert_near(a, b, 2e-5, 2e-5)


# 3-D pooling (pool3d.rs): (input shape NDHWC, ksize, strides, padding).
POOL3D_CASES = [
    ((2, 4, 5, 6, 3), 2, 2, "SAME"),
    ((1, 5, 7, 6, 2), 3, 2, "SAME"),
    ((2, 4, 4, 5, 4), (3, 2, 2), 1, "VALID"),
    ((1, 6, 5, 7, 1), (2, 3, 2), (3, 1, 2), "SAME"),
    ((1, 3, 4, 4, 5), (1, 2, 2), (1, 2, 2), "VALID"),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("pool", ["max", "avg"])
@pytest.mark.parametrize("shape,k,s,pad", POOL3D_CASES)
def test_pool3d_and_gradient(tf, dtype, pool, shape, k, s, pad):
    """MaxPool3D / AvgPool3D and their gradients against TensorFlow's CPU kernels: max pooling
    of small integers (many ties: the CPU's gradient goes to every tied maximum) exactly in
    float32; averages and float16 gradients (the CPU adds halves in half, the GPU in float32
    rounded once) within their rounding."""
    fn = tf.nn.max_pool3d if pool == "max" else tf.nn.avg_pool3d
    x = rng.integers(-3, 4, shape).astype(dtype) if pool == "max" else rng.uniform(-2, 2, shape).astype(dtype)
    ops = ("MaxPool3D", "MaxPool3DGrad") if pool == "max" else ("AvgPool3D", "AvgPool3DGrad")
    with RanOnGpu(*ops):
        with tf.device("/GPU:0"):
            gy, gdx = pool_grads(tf, fn, x, dtype, k, s, pad, fmt="NDHWC")
    with tf.device("/CPU:0"):
        cy, cdx = pool_grads(tf, fn, x, dtype, k, s, pad, fmt="NDHWC")
    assert on_gpu(gy) and on_gpu(gdx)
    if pool == "max":
        assert_near(gy, cy, 0)
    else:
        assert_near(gy, cy, 2e-3 if dtype == "float16" else 1e-6)
    # Each input's gradient sums at most ceil(k / s)^3 weights of 1/7 multiples.
    assert_near(gdx, cdx, 4e-3 if dtype == "float16" else 1e-6)


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_pool3d_ncdhw_and_nan(tf, pool):
    """NCDHW on the GPU against NDHWC on the CPU, with NaN inputs (ignored by the max, passed
    through by the average) and a window of only NaN and -inf (the lowest finite value)."""
    fn = tf.nn.max_pool3d if pool == "max" else tf.nn.avg_pool3d
    x = rng.uniform(-2, 2, (2, 4, 5, 6, 3)).astype(np.float32)
    x[0, 0, 0, 0, 0] = np.nan
    x[1, :2, :2, :2, 1] = -np.inf
    x[1, 0, 0, 0, 1] = np.nan
    t, back = (0, 4, 1, 2, 3), (0, 2, 3, 4, 1)

    def run(device, v, fmt):
        with tf.device(device):
            v = tf.constant(v)
            with tf.GradientTape() as tape:
                tape.watch(v)
                y = fn(v, 2, 2, "SAME", data_format=fmt)
            dy = rng.uniform(-1, 1, y.shape).astype(np.float32) if fmt == "NDHWC" else np.transpose(dy_c, t)
            return y.numpy(), tape.gradient(y, v, output_gradients=tf.constant(dy)).numpy(), dy

    cy, cdx, dy_c = run("/CPU:0", x, "NDHWC")
    with RanOnGpu("MaxPool3D" if pool == "max" else "AvgPool3D"):
        gy, gdx, _ = run("/GPU:0", np.transpose(x, t), "NCDHW")
    gy, gdx = np.transpose(gy, back), np.transpose(gdx, back)
    for g, c in [(gy, cy), (gdx, cdx)]:
        np.testing.assert_array_equal(np.isnan(g), np.isnan(c))
        ok = ~np.isnan(c)
        assert_near(g[ok], c[ok], 1e-6)


def test_max_pool3d_grad_near_ties_and_inf(tf):
    """TensorFlow's CPU MaxPool3DGrad gives the gradient to every window element within 1e-5
    of the max (|in - out| < 1e-5 in the tensor's type): near-ties receive it too, and an
    infinite max gives none (inf - inf is NaN)."""
    x = np.zeros((3, 2, 2, 2, 1), np.float32)
    x[0, 0, 0, 0], x[0, 1, 1, 1] = 5.0, 4.999991  # within 1e-5: both
    x[1, 0, 0, 0], x[1, 1, 1, 1] = 5.0, 4.99998  # 2e-5 apart: the max only
    x[2, 0, 1, 0] = np.inf
    for dtype in ("float32", "float16"):
        xs = x.astype(dtype)
        if dtype == "float16":
            xs[0, 0, 0, 1], xs[0, 1, 0, 0] = 3e-6, 9e-6  # halves 6e-6 apart near zero
        outs = {}
        for dev in ["/CPU:0", "/GPU:0"]:
            with tf.device(dev):
                v = tf.constant(xs)
                with tf.GradientTape() as tape:
                    tape.watch(v)
                    y = tf.nn.max_pool3d(v, 2, 2, "VALID")
                outs[dev] = tape.gradient(y, v).numpy()
        np.testing.assert_array_equal(outs["/GPU:0"], outs["/CPU:0"], err_msg=dtype)


def test_pool3d_windows_past_the_loop_limit(tf):
    """A window of 1 x 256 x 257 elements: on a CPU adapter (lavapipe stops a shader's loops
    after 65,535 iterations) a clean Unimplemented error; elsewhere the CPU's result."""
    x = rng.uniform(-1, 1, (1, 1, 256, 257, 1)).astype(np.float32)
    x[0, 0, 200, 250, 0] = 50.0
    with tf.device("/CPU:0"):
        want = tf.nn.max_pool3d(x, (1, 256, 257), 1, "VALID").numpy()
    with tf.device("/GPU:0"):
        try:
            got = tf.nn.max_pool3d(x, (1, 256, 257), 1, "VALID").numpy()
        except tf.errors.UnimplementedError as e:
            assert "loop iterations" in str(e)
            return
    np.testing.assert_array_equal(got, want)


def test_keras_3d_pooling_layers(tf):
    keras = tf.keras
    rng2 = np.random.default_rng(4)
    x = rng2.standard_normal((8, 6, 6, 6, 2)).astype(np.float32)
    y = rng2.integers(0, 3, 8).astype(np.int32)
    losses = {}
    for dev in ["/CPU:0", "/GPU:0"]:
        with tf.device(dev):
            keras.utils.set_random_seed(1)
            m = keras.Sequential([
                keras.Input((6, 6, 6, 2)),
                keras.layers.Conv3D(4, 3, padding="same", activation="relu"),
                keras.layers.MaxPooling3D(2),
                keras.layers.AveragePooling3D(2, padding="same"),
                keras.layers.Flatten(),
                keras.layers.Dense(3),
            ])
            m.compile(optimizer=keras.optimizers.SGD(0.05),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            with RanOnGpu("MaxPool3D", "MaxPool3DGrad", "AvgPool3D", "AvgPool3DGrad") if dev == "/GPU:0" else contextlib.nullcontext():
                losses[dev] = m.fit(x, y, batch_size=4, epochs=3, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(losses["/GPU:0"], losses["/CPU:0"], rtol=1e-4)



@pytest.mark.parametrize("layout,mode", [("channels_last", "mixed"), ("channels_first", "mixed"),
                                         ("channels_last", "float32")])
def test_keras_mixed_precision_batch_norm_is_one_fused_op(tf, layout, mode, monkeypatch):
    """Keras's BatchNormalization of float16 tensors (mixed precision) on tfwgpu GPUs: one
    FusedBatchNormV3 (and FusedBatchNormGradV3) on the halves, where Keras casts to float32,
    computes moments and normalizes in float32 and casts back (four passes over float32 copies).
    Against Keras's own layer on the CPU (the hook undone there): the same losses, weights and
    moving statistics (Keras's biased variance, from TensorFlow's Bessel-corrected batch
    variance), inference outputs, within float16 rounding. float32 layers take it only with
    `TFWGPU_KERAS_FUSED_BN=1` (mode "float32": within float32 rounding)."""
    import keras

    BN = keras.layers.BatchNormalization
    rng2 = np.random.default_rng(21)
    shape = (8, 8, 3) if layout == "channels_last" else (3, 8, 8)
    x = rng2.standard_normal((16,) + shape).astype(np.float32)
    y = rng2.integers(0, 4, 16).astype(np.int32)
    axis = -1 if layout == "channels_last" else 1
    res = {}
    policy = keras.mixed_precision.global_policy()
    if mode == "mixed":
        keras.mixed_precision.set_global_policy("mixed_float16")
    else:
        monkeypatch.setenv("TFWGPU_KERAS_FUSED_BN", "1")
    hooked = BN.call
    try:
        for dev in ["/CPU:0", "/GPU:0"]:
            BN.call = hooked.__wrapped__ if dev == "/CPU:0" else hooked
            with tf.device(dev):
                keras.utils.set_random_seed(1)
                m = keras.Sequential([
                    keras.Input(shape),
                    keras.layers.Conv2D(8, 3, data_format=layout),
                    BN(axis=axis, momentum=0.8),
                    keras.layers.ReLU(),
                    BN(axis=axis, center=False, scale=False),
                    keras.layers.GlobalAveragePooling2D(data_format=layout),
                    keras.layers.Dense(4, dtype="float32"),
                ])
                m.compile(optimizer=keras.optimizers.SGD(0.05), jit_compile=False,
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
                before = gpu_ops()
                h = m.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False)
                pred = m.predict(x, verbose=0)
                if dev == "/GPU:0":
                    after = gpu_ops()
                    for op in ["FusedBatchNormV3", "FusedBatchNormGradV3"]:
                        assert after.get(op, 0) > before.get(op, 0), (op, after)
                res[dev] = (h.history["loss"], [(w.path, w.numpy()) for w in m.weights], pred)
    finally:
        BN.call = hooked
        keras.mixed_precision.set_global_policy(policy)
    (lc, wc, pc), (lg, wg, pg) = res["/CPU:0"], res["/GPU:0"]
    # float16 activations: each normalized value is rounded to half (2^-11 relative) on both
    # paths, from float32 statistics summed in other orders.
    half = mode == "mixed"
    np.testing.assert_allclose(lg, lc, rtol=2e-3 if half else 1e-5)
    for (name, a), (_, b) in zip(wg, wc):
        # The moving variance tightly: a Bessel factor left in (batches of 288 values per
        # channel) would move it by ~2.6e-3 relative after these six updates.
        if "moving_variance" in name or not half:
            tol = dict(rtol=1e-4, atol=1e-6)
        else:
            tol = dict(rtol=2e-3, atol=5e-4)
        np.testing.assert_allclose(a, b, err_msg=name, **tol)
    np.testing.assert_allclose(pg, pc, rtol=2e-2 if half else 1e-4, atol=2e-2 if half else 1e-5)
