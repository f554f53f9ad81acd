"""conv family through TensorFlow: Conv2D, Conv2DBackpropInput, Conv2DBackpropFilter and the
depthwise ops on GPU:0 against CPU:0 (forward, gradients through tf.GradientTape, a Keras
Conv2D layer), float32 and float16, with the plugin's counters showing the kernels ran on the
GPU.

Tolerances: each result is a dot product of L terms; an f32 accumulation is within
(L + 2) * 2^-24 * sum|terms| of the exact value, so GPU and CPU agree within twice that. The
sums of absolute terms come from the same op on |inputs| (CPU). float16 results are checked
against the CPU's float32 result on the same f16 inputs, allowing the f16 rounding (2^-11
relative) on top. TensorFlow's CPU has no NCHW Conv2D / depthwise kernel: NCHW results on the
GPU are checked against NHWC on the CPU, transposed.
"""
import ctypes
import json
import zlib

import numpy as np
import pytest

from conftest import on_gpu

EPS32 = 2.0**-24


def gpu_ops():
    import tensorflow_wgpu

    lib = tensorflow_wgpu._plugin()
    lib.tfwgpu_stats_json.restype = ctypes.c_char_p
    return json.loads(lib.tfwgpu_stats_json().decode())["gpu_ops"]


def ran(before, op):
    return gpu_ops().get(op, 0) - before.get(op, 0)


def to_nchw(a):
    return np.transpose(a, (0, 3, 1, 2))


def to_nhwc(a):
    return np.transpose(a, (0, 2, 3, 1))


def assert_dot_close(got, want, abs_sum, terms, f16=False, what="", parts_rounded=False):
    """`parts_rounded`: float16 results summed from partial sums that were each rounded to
    float16 first (Conv3D's taps): those roundings add at most 2^-11 of the absolute sum."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    tol = 2 * (terms + 2) * EPS32 * np.asarray(abs_sum, np.float64)
    if f16:
        tol = tol * (1 + 2.0**-11) + np.abs(want) * 2.0**-11 + 2.0**-25
        if parts_rounded:
            tol = tol + np.asarray(abs_sum, np.float64) * 2.0**-11
    assert got.shape == want.shape, what
    bad = np.abs(got - want) > tol
    assert not bad.any(), (
        f"{what}: {bad.sum()} of {bad.size} off; worst at {np.unravel_index(np.argmax(np.abs(got - want) - tol), got.shape)}: "
        f"got {got[bad][:3]}, want {want[bad][:3]}"
    )


def rnd(rng, shape, dtype=np.float32):
    return rng.uniform(-1, 1, shape).astype(dtype)


# (name, x shape NHWC, filter shape, strides, padding, dilations)
CONV_CASES = [
    ("3x3_same", (2, 7, 6, 3), (3, 3, 3, 5), 1, "SAME", 1),
    ("3x3_valid_s2", (1, 9, 8, 4), (3, 3, 4, 7), 2, "VALID", 1),
    ("5x5_s3", (2, 11, 10, 2), (5, 5, 2, 3), 3, "SAME", 1),
    ("dilated", (1, 9, 9, 3), (3, 3, 3, 4), 1, "VALID", 2),
    ("explicit", (2, 6, 7, 3), (3, 2, 3, 4), (1, 2), [[0, 0], [1, 2], [0, 3], [0, 0]], 1),
    ("1x1", (3, 5, 4, 9), (1, 1, 9, 33), 1, "VALID", 1),
    ("1x1_s2", (1, 7, 7, 6), (1, 1, 6, 5), 2, "SAME", 1),
    ("wide", (1, 4, 5, 70), (3, 3, 70, 67), 1, "SAME", 1),
]


def conv_abs(tf, x, f, **kw):
    with tf.device("/CPU:0"):
        return tf.nn.conv2d(np.abs(x), np.abs(f), **kw).numpy()


def dilate(f, d):
    """The filter with d - 1 zeros between taps: an undilated convolution with it is the
    dilated convolution with f."""
    if d == 1:
        return f
    r, s = f.shape[:2]
    out = np.zeros(((r - 1) * d + 1, (s - 1) * d + 1) + f.shape[2:], f.dtype)
    out[::d, ::d] = f
    return out


def cpu_conv(tf, x, f, dy, strides, padding, dil):
    """(y, dx, df) on the CPU in NHWC. TensorFlow's CPU backprops reject dilations, so dilated
    convolutions go through the zero-inserted filter."""
    with tf.device("/CPU:0"):
        xc, fc = tf.constant(x), tf.constant(dilate(f, dil))
        with tf.GradientTape(persistent=True) as t:
            t.watch([xc, fc])
            y = tf.nn.conv2d(xc, fc, strides=strides, padding=padding)
        if dy is None:
            return y.numpy(), None, None
        dx, df = t.gradient(y, [xc, fc], output_gradients=tf.constant(dy))
        return y.numpy(), dx.numpy(), df.numpy()[::dil, ::dil]


@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_conv2d_forward_and_gradients(tf, case, fmt):
    name, xs, fs, strides, padding, dil = case
    rng = np.random.default_rng(zlib.crc32(f"{name} {fmt}".encode()))
    x, f = rnd(rng, xs), rnd(rng, fs)
    y0, _, _ = cpu_conv(tf, x, f, None, strides, padding, dil)
    dy = rnd(rng, y0.shape)
    yc, dxc, dfc = cpu_conv(tf, x, f, dy, strides, padding, dil)
    ya, dxa, dfa = cpu_conv(tf, np.abs(x), np.abs(f), np.abs(dy), strides, padding, dil)
    gx, gdy = (to_nchw(x), to_nchw(dy)) if fmt == "NCHW" else (x, dy)
    gkw = dict(strides=strides, padding=padding, dilations=dil)
    if fmt == "NCHW":
        gkw["data_format"] = "NCHW"
        if isinstance(padding, list):
            gkw["padding"] = [padding[0], padding[3], padding[1], padding[2]]
    before = gpu_ops()
    with tf.device("/GPU:0"):
        xg, fg = tf.constant(gx), tf.constant(f)
        with tf.GradientTape(persistent=True) as t:
            t.watch([xg, fg])
            yg = tf.nn.conv2d(xg, fg, **gkw)
        dxg, dfg = t.gradient(yg, [xg, fg], output_gradients=tf.constant(gdy))
    assert on_gpu(yg) and on_gpu(dxg) and on_gpu(dfg)
    for op in ["Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"]:
        assert ran(before, op) >= 1, f"{op} did not run on the GPU: {gpu_ops()}"
    back = to_nhwc if fmt == "NCHW" else (lambda a: a)
    r, s, c, k = fs
    n_out = int(np.prod(yc.shape[:3]))
    assert_dot_close(back(yg.numpy()), yc, ya, r * s * c, what="y")
    assert_dot_close(back(dxg.numpy()), dxc, dxa, r * s * k, what="dx")
    assert_dot_close(dfg.numpy(), dfc, dfa, n_out, what="df")


# float16 cases with 64 output channels (K tiles of 64 within one tap): with
# TFWGPU_COOP_EMULATE=1 their input gradients at stride 2 take the cooperative-matrix phase
# products (one per output phase: 3x3 SAME on even sizes, all four phases in one launch; 1x1
# VALID on odd sizes, one phase with taps writing the others' zeros); otherwise the GEMM.
F16_COOP_CASES = [
    ("3x3_s2_k64", (2, 8, 8, 16), (3, 3, 16, 64), 2, "SAME", 1),
    ("1x1_s2_k64", (1, 9, 7, 8), (1, 1, 8, 64), 2, "VALID", 1),
]
F16_CASES = CONV_CASES[:6:2] + F16_COOP_CASES


@pytest.mark.parametrize("case", F16_CASES, ids=[c[0] for c in F16_CASES])
def test_conv2d_float16(tf, case):
    name, xs, fs, strides, padding, dil = case
    rng = np.random.default_rng(7)
    x, f = rnd(rng, xs, np.float16), rnd(rng, fs, np.float16)
    kw = dict(strides=strides, padding=padding, dilations=dil)
    with tf.device("/CPU:0"):
        want = tf.nn.conv2d(x.astype(np.float32), f.astype(np.float32), **kw).numpy()
        dy = rnd(rng, want.shape, np.float16)
    before = gpu_ops()
    with tf.device("/GPU:0"):
        xg, fg = tf.constant(x), tf.constant(f)
        with tf.GradientTape(persistent=True) as t:
            t.watch([xg, fg])
            yg = tf.nn.conv2d(xg, fg, **kw)
        dxg, dfg = t.gradient(yg, [xg, fg], output_gradients=tf.constant(dy))
    assert yg.dtype == tf.float16 and on_gpu(yg)
    for op in ["Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"]:
        assert ran(before, op) >= 1, op
    r, s, c, k = fs
    assert_dot_close(yg.numpy(), want, conv_abs(tf, x.astype(np.float32), f.astype(np.float32), **kw), r * s * c, f16=True, what="y")
    with tf.device("/CPU:0"):
        x32, f32, dy32 = (tf.constant(a.astype(np.float32)) for a in (x, f, dy))
        with tf.GradientTape(persistent=True) as t:
            t.watch([x32, f32])
            y32 = tf.nn.conv2d(x32, f32, **kw)
        dx32, df32 = t.gradient(y32, [x32, f32], output_gradients=dy32)
        with tf.GradientTape(persistent=True) as t:
            xa, fa = tf.constant(np.abs(x32)), tf.constant(np.abs(f32))
            t.watch([xa, fa])
            ya = tf.nn.conv2d(xa, fa, **kw)
        dxa, dfa = t.gradient(ya, [xa, fa], output_gradients=tf.abs(dy32))
    n_out = int(np.prod(want.shape[:3]))
    assert_dot_close(dxg.numpy(), dx32.numpy(), dxa.numpy(), r * s * k, f16=True, what="dx")
    assert_dot_close(dfg.numpy(), df32.numpy(), dfa.numpy(), n_out, f16=True, what="df")


def test_grouped_conv2d_forward(tf):
    # TensorFlow's CPU runs grouped Conv2D forward (not its gradients).
    rng = np.random.default_rng(3)
    x, f = rnd(rng, (2, 6, 5, 6)), rnd(rng, (3, 3, 2, 9))
    with tf.device("/CPU:0"):
        want = tf.nn.conv2d(x, f, 1, "SAME").numpy()
    before = gpu_ops()
    with tf.device("/GPU:0"):
        got = tf.nn.conv2d(x, f, 1, "SAME")
    assert on_gpu(got) and ran(before, "Conv2D") == 1
    assert_dot_close(got.numpy(), want, conv_abs(tf, x, f, strides=1, padding="SAME"), 18)


# (name, x shape NHWC, filter shape [r, s, c, mult], stride, padding)
DW_CASES = [
    ("3x3_same", (2, 7, 6, 3), (3, 3, 3, 1), 1, "SAME"),
    ("3x3_s2_m2", (1, 9, 8, 4), (3, 3, 4, 2), 2, "VALID"),
    ("5x5_m3", (2, 6, 7, 2), (5, 5, 2, 3), 1, "SAME"),
    ("3x2_s3", (1, 10, 9, 5), (3, 2, 5, 1), 3, "SAME"),
    ("explicit", (2, 5, 6, 3), (3, 3, 3, 2), 1, [[0, 0], [1, 2], [0, 3], [0, 0]]),
    ("wide", (1, 4, 4, 67), (3, 3, 67, 1), 1, "SAME"),
    # Multiplier 1, channels a multiple of 4, filters up to 3x3: the vector kernels (the
    # filter gradient's per-tap sums in registers, depthwise_bwdf.wgsl).
    ("3x3_c8", (2, 9, 7, 8), (3, 3, 8, 1), 1, "SAME"),
    ("3x3_s2_c12", (3, 8, 9, 12), (3, 3, 12, 1), 2, "VALID"),
    ("2x3_c260", (2, 6, 5, 260), (2, 3, 260, 1), 1, "SAME"),
]


@pytest.mark.parametrize("case", DW_CASES, ids=[c[0] for c in DW_CASES])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_depthwise_forward_and_gradients(tf, case, fmt):
    name, xs, fs, stride, padding = case
    if fmt == "NCHW" and isinstance(padding, list):
        pytest.skip("tf.nn.depthwise_conv2d takes explicit padding in NHWC order only")
    rng = np.random.default_rng(zlib.crc32(f"{name} {fmt}".encode()))
    x, f = rnd(rng, xs), rnd(rng, fs)
    strides = [1, stride, stride, 1]
    with tf.device("/CPU:0"):
        xc, fc = tf.constant(x), tf.constant(f)
        with tf.GradientTape(persistent=True) as t:
            t.watch([xc, fc])
            yc = tf.nn.depthwise_conv2d(xc, fc, strides, padding)
        dy = rnd(rng, yc.shape)
        dxc, dfc = t.gradient(yc, [xc, fc], output_gradients=tf.constant(dy))
        xa, fa = tf.constant(np.abs(x)), tf.constant(np.abs(f))
        with tf.GradientTape(persistent=True) as t:
            t.watch([xa, fa])
            ya = tf.nn.depthwise_conv2d(xa, fa, strides, padding)
        dxa, dfa = t.gradient(ya, [xa, fa], output_gradients=tf.constant(np.abs(dy)))
    if fmt == "NCHW":
        gx, gdy, gstrides = to_nchw(x), to_nchw(dy), [1, 1, stride, stride]
        back = to_nhwc
    else:
        gx, gdy, gstrides, back = x, dy, strides, (lambda a: a)
    before = gpu_ops()
    with tf.device("/GPU:0"):
        xg, fg = tf.constant(gx), tf.constant(f)
        with tf.GradientTape(persistent=True) as t:
            t.watch([xg, fg])
            yg = tf.nn.depthwise_conv2d(xg, fg, gstrides, padding, data_format=fmt)
        dxg, dfg = t.gradient(yg, [xg, fg], output_gradients=tf.constant(gdy))
    assert on_gpu(yg) and on_gpu(dxg) and on_gpu(dfg)
    for op in [
        "DepthwiseConv2dNative",
        "DepthwiseConv2dNativeBackpropInput",
        "DepthwiseConv2dNativeBackpropFilter",
    ]:
        assert ran(before, op) >= 1, f"{op} did not run on the GPU: {gpu_ops()}"
    r, s, c, m = fs
    n_out = int(np.prod(yc.shape[:3]))
    assert_dot_close(back(yg.numpy()), yc.numpy(), ya.numpy(), r * s, what="y")
    assert_dot_close(back(dxg.numpy()), dxc.numpy(), dxa.numpy(), r * s * m, what="dx")
    assert_dot_close(dfg.numpy(), dfc.numpy(), dfa.numpy(), n_out, what="df")


@pytest.mark.parametrize("case", DW_CASES[:3], ids=[c[0] for c in DW_CASES[:3]])
def test_depthwise_float16_raw_ops(tf, case):
    name, xs, fs, stride, padding = case
    rng = np.random.default_rng(11)
    x, f = rnd(rng, xs, np.float16), rnd(rng, fs, np.float16)
    kw = dict(strides=[1, stride, stride, 1], padding=padding)
    ops = tf.raw_ops
    with tf.device("/CPU:0"):
        y32 = ops.DepthwiseConv2dNative(input=x.astype(np.float32), filter=f.astype(np.float32), **kw).numpy()
        dy = rnd(rng, y32.shape, np.float16)
        dx32 = ops.DepthwiseConv2dNativeBackpropInput(input_sizes=xs, filter=f.astype(np.float32), out_backprop=dy.astype(np.float32), **kw).numpy()
        df32 = ops.DepthwiseConv2dNativeBackpropFilter(input=x.astype(np.float32), filter_sizes=fs, out_backprop=dy.astype(np.float32), **kw).numpy()
        ya = ops.DepthwiseConv2dNative(input=np.abs(x).astype(np.float32), filter=np.abs(f).astype(np.float32), **kw).numpy()
        dxa = ops.DepthwiseConv2dNativeBackpropInput(input_sizes=xs, filter=np.abs(f).astype(np.float32), out_backprop=np.abs(dy).astype(np.float32), **kw).numpy()
        dfa = ops.DepthwiseConv2dNativeBackpropFilter(input=np.abs(x).astype(np.float32), filter_sizes=fs, out_backprop=np.abs(dy).astype(np.float32), **kw).numpy()
    with tf.device("/GPU:0"):
        y = ops.DepthwiseConv2dNative(input=x, filter=f, **kw)
        dx = ops.DepthwiseConv2dNativeBackpropInput(input_sizes=tf.constant(xs), filter=f, out_backprop=dy, **kw)
        df = ops.DepthwiseConv2dNativeBackpropFilter(input=x, filter_sizes=tf.constant(fs), out_backprop=dy, **kw)
    assert all(on_gpu(t) and t.dtype == tf.float16 for t in (y, dx, df))
    r, s, c, m = fs
    assert_dot_close(y.numpy(), y32, ya, r * s, f16=True, what="y")
    assert_dot_close(dx.numpy(), dx32, dxa, r * s * m, f16=True, what="dx")
    assert_dot_close(df.numpy(), df32, dfa, int(np.prod(y32.shape[:3])), f16=True, what="df")


def test_bad_conv_raises_like_cpu(tf):
    x = np.zeros((1, 5, 5, 4), np.float32)
    f = np.zeros((3, 3, 3, 6), np.float32)
    for dev in ["/CPU:0", "/GPU:0"]:
        with tf.device(dev):
            with pytest.raises(tf.errors.InvalidArgumentError, match="evenly divisible"):
                tf.raw_ops.Conv2D(input=x, filter=f, strides=[1, 1, 1, 1], padding="SAME")


def _keras_model(keras, seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((10, 9, 3)),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
            keras.layers.DepthwiseConv2D(3, strides=2, depth_multiplier=2),
            keras.layers.Conv2D(5, 1),
            keras.layers.Flatten(),
            keras.layers.Dense(3),
        ]
    )


def test_keras_conv2d_layer_trains_like_cpu(tf):
    keras = tf.keras
    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, 10, 9, 3)).astype(np.float32)
    y = rng.integers(0, 3, 16).astype(np.int32)
    losses = {}
    for dev in ["/CPU:0", "/GPU:0"]:
        with tf.device(dev):
            model = _keras_model(keras, 0)
            model.compile(
                optimizer=keras.optimizers.SGD(0.05),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
            before = gpu_ops()
            hist = model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
            losses[dev] = hist.history["loss"]
            if dev == "/GPU:0":
                for op in ["Conv2D", "Conv2DBackpropFilter", "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropFilter"]:
                    assert ran(before, op) >= 1, f"{op}: {gpu_ops()}"
                out = model(x[:4])
                assert on_gpu(out)
    np.testing.assert_allclose(losses["/GPU:0"], losses["/CPU:0"], rtol=1e-4)


# Conv3D and its V2 gradients (sums of the 2-D ops over depth taps, conv3d.rs).
# (name, x shape NDHWC, filter shape, strides (d, h, w), padding, dilations (d, h, w))
CONV3D_CASES = [
    ("3x3x3_same", (2, 5, 6, 7, 3), (3, 3, 3, 3, 4), (1, 1, 1), "SAME", (1, 1, 1)),
    ("3x3x3_valid", (2, 5, 6, 7, 3), (3, 3, 3, 3, 4), (1, 1, 1), "VALID", (1, 1, 1)),
    ("s221", (2, 7, 6, 5, 4), (3, 2, 3, 4, 5), (2, 2, 1), "SAME", (1, 1, 1)),
    ("s312_valid", (1, 8, 5, 5, 2), (2, 3, 3, 2, 3), (3, 1, 2), "VALID", (1, 1, 1)),
    ("dilated", (2, 9, 6, 6, 3), (3, 3, 2, 3, 2), (1, 1, 1), "SAME", (2, 1, 2)),
    ("dilated_s2", (2, 9, 6, 6, 3), (2, 2, 2, 3, 2), (2, 1, 1), "VALID", (3, 1, 1)),
    ("1x1x1", (3, 4, 4, 4, 5), (1, 1, 1, 5, 6), (1, 1, 1), "SAME", (1, 1, 1)),
    ("1x1x1_s2", (2, 4, 4, 4, 5), (1, 1, 1, 5, 6), (2, 2, 2), "VALID", (1, 1, 1)),
    # Taps past the input on both sides (some only meet padding), odd per-tap sizes.
    ("deep_filter", (1, 3, 5, 5, 2), (5, 3, 3, 2, 3), (1, 1, 1), "SAME", (1, 1, 1)),
    ("odd_taps", (1, 4, 5, 5, 1), (3, 3, 3, 1, 1), (1, 1, 1), "SAME", (1, 1, 1)),
    ("s2_deep", (1, 2, 3, 3, 2), (4, 1, 1, 2, 2), (2, 1, 1), "SAME", (1, 1, 1)),
]


def dilate3(f, d):
    """The 3-D filter with zeros between taps (TensorFlow's CPU gradients reject dilations)."""
    if d == (1, 1, 1):
        return f
    shape = tuple((k - 1) * s + 1 for k, s in zip(f.shape[:3], d)) + f.shape[3:]
    out = np.zeros(shape, f.dtype)
    out[:: d[0], :: d[1], :: d[2]] = f
    return out


def cpu_conv3d(tf, x, f, dy, strides, padding, dil):
    """(y, dx, df) on the CPU (NDHWC, dilations through the zero-inserted filter)."""
    with tf.device("/CPU:0"):
        xc, fc = tf.constant(x), tf.constant(dilate3(f, dil))
        with tf.GradientTape() as t:
            t.watch([xc, fc])
            y = tf.nn.conv3d(xc, fc, strides=[1, *strides, 1], padding=padding)
        dx, df = t.gradient(y, [xc, fc], output_gradients=tf.constant(dy))
        return y.numpy(), dx.numpy(), df.numpy()[:: dil[0], :: dil[1], :: dil[2]]


def to_ncdhw(a):
    return np.transpose(a, (0, 4, 1, 2, 3))


def to_ndhwc(a):
    return np.transpose(a, (0, 2, 3, 4, 1))


@pytest.mark.parametrize("case", CONV3D_CASES, ids=[c[0] for c in CONV3D_CASES])
@pytest.mark.parametrize("dtype,fmt", [("float32", "NDHWC"), ("float16", "NDHWC"), ("float32", "NCDHW")])
def test_conv3d_forward_and_gradients(tf, case, dtype, fmt):
    """Conv3D, Conv3DBackpropInputV2 and Conv3DBackpropFilterV2 on the GPU against the CPU's
    float32 results (float16: on the same f16 inputs, plus f16 rounding). The bound of each
    element is its dot product's (terms: kd*kh*kw*c forward, kd*kh*kw*k for the input gradient,
    n*od*oh*ow for the filter's), from the same op on absolute values."""
    name, xs, fs, strides, padding, dil = case
    f16 = dtype == "float16"
    rng = np.random.default_rng(zlib.crc32(f"{name} {dtype} {fmt}".encode()))
    x, f = rnd(rng, xs, np.dtype(dtype)), rnd(rng, fs, np.dtype(dtype))
    x32, f32 = x.astype(np.float32), f.astype(np.float32)
    with tf.device("/CPU:0"):
        y = tf.nn.conv3d(x32, dilate3(f32, dil), [1, *strides, 1], padding).numpy()
    dy = rnd(rng, y.shape, np.dtype(dtype))
    y, dx, df = cpu_conv3d(tf, x32, f32, dy.astype(np.float32), strides, padding, dil)
    ya, dxa, dfa = cpu_conv3d(tf, np.abs(x32), np.abs(f32), np.abs(dy.astype(np.float32)), strides, padding, dil)
    before = gpu_ops()
    ncdhw = fmt == "NCDHW"
    with tf.device("/GPU:0"):
        xg = tf.constant(to_ncdhw(x) if ncdhw else x)
        fg = tf.constant(f)
        dyg = tf.constant(to_ncdhw(dy) if ncdhw else dy)
        kw = dict(strides=[1, 1, *strides] if ncdhw else [1, *strides, 1], padding=padding, data_format=fmt,
                  dilations=[1, 1, *dil] if ncdhw else [1, *dil, 1])
        gy = tf.raw_ops.Conv3D(input=xg, filter=fg, **kw)
        gdx = tf.raw_ops.Conv3DBackpropInputV2(input_sizes=list(xg.shape), filter=fg, out_backprop=dyg, **kw)
        gdf = tf.raw_ops.Conv3DBackpropFilterV2(input=xg, filter_sizes=list(fs), out_backprop=dyg, **kw)
    for op in ["Conv3D", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2"]:
        assert ran(before, op) == 1, op
    assert on_gpu(gy) and gy.dtype == dtype
    back = to_ndhwc if ncdhw else (lambda a: a)
    kd, kh, kw_, c, k = fs
    n_out = y.shape[0] * y.shape[1] * y.shape[2] * y.shape[3]
    # float16: each depth tap's 2-D product is rounded to float16 before the taps are summed.
    assert_dot_close(back(gy.numpy()), y, ya, kd * kh * kw_ * c, f16, "forward", parts_rounded=True)
    assert_dot_close(back(gdx.numpy()), dx, dxa, kd * kh * kw_ * k, f16, "input gradient", parts_rounded=True)
    assert_dot_close(gdf.numpy(), df, dfa, n_out, f16, "filter gradient")


def test_grouped_conv3d(tf):
    """Input depth a multiple of the filter's: grouped Conv2Ds on the GPU (TensorFlow's CPU has
    no grouped Conv3D: checked against one convolution per group, concatenated)."""
    rng = np.random.default_rng(8)
    x, f = rnd(rng, (2, 4, 5, 5, 6)), rnd(rng, (3, 3, 2, 3, 4))
    with tf.device("/CPU:0"):
        parts = [
            tf.nn.conv3d(x[..., 3 * g : 3 * g + 3], f[..., 2 * g : 2 * g + 2], [1, 1, 1, 1, 1], "SAME")
            for g in range(2)
        ]
        want = tf.concat(parts, -1).numpy()
        absum = tf.concat(
            [tf.nn.conv3d(np.abs(x[..., 3 * g : 3 * g + 3]), np.abs(f[..., 2 * g : 2 * g + 2]), [1, 1, 1, 1, 1], "SAME")
             for g in range(2)], -1).numpy()
    with tf.device("/GPU:0"):
        got = tf.nn.conv3d(x, f, [1, 1, 1, 1, 1], "SAME")
    assert on_gpu(got)
    assert_dot_close(got.numpy(), want, absum, 3 * 3 * 2 * 3, what="grouped")


def test_conv3d_errors(tf):
    x = np.zeros((1, 4, 4, 4, 2), np.float32)
    f = np.zeros((2, 2, 2, 2, 3), np.float32)
    with tf.device("/GPU:0"):
        with pytest.raises(tf.errors.InvalidArgumentError, match="filter must be 5-dimensional"):
            tf.raw_ops.Conv3D(input=x, filter=f[0], strides=[1, 1, 1, 1, 1], padding="SAME")
        with pytest.raises(tf.errors.UnimplementedError, match="strides in the batch"):
            tf.raw_ops.Conv3D(input=x, filter=f, strides=[2, 1, 1, 1, 1], padding="SAME")
        with pytest.raises(tf.errors.InvalidArgumentError, match="evenly divisible"):
            tf.raw_ops.Conv3D(input=x, filter=np.zeros((2, 2, 2, 3, 3), np.float32), strides=[1, 1, 1, 1, 1], padding="SAME")
        # An empty batch: empty outputs; the filter gradient of nothing is zeros.
        e = tf.raw_ops.Conv3D(input=x[:0], filter=f, strides=[1, 1, 1, 1, 1], padding="SAME")
        assert e.shape == (0, 4, 4, 4, 3)
        df = tf.raw_ops.Conv3DBackpropFilterV2(
            input=x[:0], filter_sizes=[2, 2, 2, 2, 3], out_backprop=np.zeros((0, 4, 4, 4, 3), np.float32),
            strides=[1, 1, 1, 1, 1], padding="SAME")
        np.testing.assert_array_equal(df.numpy(), 0)


def test_keras_conv3d_trains_like_cpu(tf):
    keras = tf.keras
    rng = np.random.default_rng(9)
    x = rng.standard_normal((8, 6, 7, 5, 2)).astype(np.float32)
    y = rng.integers(0, 3, 8).astype(np.int32)
    losses = {}
    for dev in ["/CPU:0", "/GPU:0"]:
        with tf.device(dev):
            keras.utils.set_random_seed(2)
            model = keras.Sequential([
                keras.Input((6, 7, 5, 2)),
                keras.layers.Conv3D(4, 3, padding="same", activation="relu"),
                keras.layers.Conv3D(5, (2, 3, 3), strides=(2, 1, 2)),
                keras.layers.GlobalAveragePooling3D(),
                keras.layers.Dense(3),
            ])
            model.compile(optimizer=keras.optimizers.SGD(0.05),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            before = gpu_ops()
            losses[dev] = model.fit(x, y, batch_size=4, epochs=3, shuffle=False, verbose=0).history["loss"]
            if dev == "/GPU:0":
                for op in ["Conv3D", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2"]:
                    assert ran(before, op) >= 1, f"{op}: {gpu_ops()}"
    np.testing.assert_allclose(losses["/GPU:0"], losses["/CPU:0"], rtol=1e-4)


@pytest.mark.parametrize("layer", ["grouped2d", "channels_first3d"])
def test_keras_convs_keras_compiles_with_xla(tf, layer):
    """Keras compiles grouped convolutions and channels-first Conv3D with XLA (TensorFlow's CPU
    kernels lack them), which has no compiler for the plugin's device: on tfwgpu GPUs the hook
    runs them as plain convolutions, on the plugin's kernels; losses track the CPU (XLA), in
    `fit`'s graph and, for Conv3D, with `run_eagerly=True` (the eager gradient of a 3-D
    convolution needs its data format given explicitly: TensorFlow's tape reads it back)."""
    keras = tf.keras
    rng2 = np.random.default_rng(12)
    L = keras.layers
    shape, layers = {
        "grouped2d": ((9, 8, 4), lambda: [L.Conv2D(6, 3, groups=2, padding="same"), L.Flatten()]),
        # Pooled rather than flattened: TensorFlow's CPU graph of the flattened model gives other
        # losses than its own eager run (the GPU matches the eager one); not the plugin's.
        "channels_first3d": (
            (2, 5, 6, 6),
            lambda: [L.Conv3D(4, 3, data_format="channels_first"), L.GlobalAveragePooling3D(data_format="channels_first")],
        ),
    }[layer]
    x = rng2.standard_normal((8,) + shape).astype(np.float32)
    y = rng2.integers(0, 3, 8).astype(np.int32)
    losses = {}
    runs = [("/CPU:0", False), ("/GPU:0", False)] + ([("/GPU:0", True)] if "3d" in layer else [])
    for dev, eager in runs:
        with tf.device(dev):
            keras.utils.set_random_seed(3)
            m = keras.Sequential([keras.Input(shape)] + layers() + [L.Dense(3)])
            m.compile(optimizer=keras.optimizers.SGD(0.05), run_eagerly=eager,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            before = gpu_ops()
            losses[dev, eager] = m.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0).history["loss"]
            if dev == "/GPU:0":
                ops = ["Conv3D"] if "3d" in layer else ["Conv2D", "_TfwgpuConv2DBiasAdd"]
                assert sum(ran(before, op) for op in ops) >= 1, gpu_ops()
                if "3d" in layer:
                    assert ran(before, "Conv3DBackpropFilterV2") >= 1, gpu_ops()
    for dev, eager in runs[1:]:
        np.testing.assert_allclose(losses[dev, eager], losses["/CPU:0", False], rtol=1e-4)


def test_keras_grouped_conv3d_matches_its_groups_split(tf):
    """Keras's grouped Conv3D (compiled with XLA by Keras, and which TensorFlow's CPU kernels
    reject) trains on the plugin's kernels through the hook, in `fit`'s graph and eagerly: the
    losses and weights of the same model written as its two groups (split channels, two
    Conv3Ds, concatenated) on TensorFlow's CPU, from the same initial weights."""
    keras = tf.keras
    L = keras.layers
    rng2 = np.random.default_rng(13)
    x = rng2.standard_normal((8, 5, 6, 6, 4)).astype(np.float32)
    y = rng2.integers(0, 3, 8).astype(np.int32)

    def compiled(m, eager):
        m.compile(optimizer=keras.optimizers.SGD(0.05), run_eagerly=eager,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    keras.utils.set_random_seed(4)
    inp = keras.Input((5, 6, 6, 4))
    init = keras.Model(inp, L.Dense(3)(L.GlobalAveragePooling3D()(
        L.Conv3D(6, 3, groups=2, padding="same", strides=(1, 2, 1))(inp))))
    k, b, dk, db = [w.numpy() for w in init.weights]
    results = {}
    for eager in (False, True):
        with tf.device("/GPU:0"):
            m = compiled(keras.models.clone_model(init), eager)
            m.set_weights([k, b, dk, db])
            before = gpu_ops()
            loss = m.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0).history["loss"]
            for op in ["Conv3D", "Conv3DBackpropFilterV2"]:
                assert ran(before, op) >= 1, (op, gpu_ops())
            results[eager] = (loss, [w.numpy() for w in m.weights])
    with tf.device("/CPU:0"):
        inp = keras.Input((5, 6, 6, 4))
        halves = [L.Lambda(lambda t, g=g: t[..., 2 * g:2 * g + 2])(inp) for g in range(2)]
        convs = [L.Conv3D(3, 3, padding="same", strides=(1, 2, 1)) for _ in range(2)]
        out = L.Concatenate()([c(h) for c, h in zip(convs, halves)])
        ref = compiled(keras.Model(inp, L.Dense(3)(L.GlobalAveragePooling3D()(out))), False)
        convs[0].set_weights([k[..., :3], b[:3]])
        convs[1].set_weights([k[..., 3:], b[3:]])
        ref.layers[-1].set_weights([dk, db])
        ref_loss = ref.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0).history["loss"]
        rk = np.concatenate([convs[0].kernel.numpy(), convs[1].kernel.numpy()], -1)
        rb = np.concatenate([convs[0].bias.numpy(), convs[1].bias.numpy()], -1)
    for eager, (loss, (gk, gb, gdk, gdb)) in results.items():
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-4, err_msg=f"eager={eager}")
        # Four SGD steps of float32 products of 108 terms: rounding-level differences.
        np.testing.assert_allclose(gk, rk, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(gb, rb, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(gdk, ref.layers[-1].kernel.numpy(), rtol=1e-4, atol=1e-5)
