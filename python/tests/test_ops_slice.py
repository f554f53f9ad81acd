"""The slice family through TensorFlow: each op on /GPU:0 against /CPU:0 (Slice, StridedSlice,
StridedSliceGrad, Pad, PadV2, MirrorPad, MirrorPadGrad, GatherV2, OneHot, Range, Erf, Erfc,
UnsortedSegmentSum),
every registered dtype, awkward shapes, gradients through tf.GradientTape, and a check that the
kernels really ran on the GPU (the plugin's per-op counters)."""
import contextlib

import numpy as np
import pytest

from conftest import on_gpu, ran_on_gpu, ran_on_host, same_error

MOVE_DTYPES = ["float32", "float16", "int64", "bool", "uint8"]


def rand(rng, shape, dtype):
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype in ("int64", "int32"):
        return rng.integers(-1000, 1000, shape).astype(dtype)
    if dtype == "uint8":
        return rng.integers(0, 256, shape).astype(np.uint8)
    return rng.standard_normal(shape).astype(dtype)


def both(tf, fn, *arrays):
    with tf.device("/GPU:0"):
        g = fn(*[tf.constant(a) for a in arrays])
    with tf.device("/CPU:0"):
        c = fn(*[tf.constant(a) for a in arrays])
    return g, c


def same(g, c):
    assert g.dtype == c.dtype and g.shape == c.shape, (g.dtype, c.dtype, g.shape, c.shape)
    np.testing.assert_array_equal(g.numpy(), c.numpy())


# ------------------------------------------------------------------ StridedSlice

PY_SLICES = [
    ("x[1:-1:2, ..., None]", (7, 3, 5), lambda x: x[1:-1:2, ..., None]),
    ("x[::-1]", (129,), lambda x: x[::-1]),
    ("x[2, :, ::-2]", (4, 3, 7), lambda x: x[2, :, ::-2]),
    ("x[-1]", (5, 3), lambda x: x[-1]),
    ("x[None, 1, ..., 1:4:2]", (2, 3, 4, 5), lambda x: x[None, 1, ..., 1:4:2]),
    ("x[-100:100:3, 4:2]", (5, 6), lambda x: x[-100:100:3, 4:2]),
    ("x[..., -2]", (2, 3, 4), lambda x: x[..., -2]),
    ("x[1:, 6:0:-3]", (3, 7), lambda x: x[1:, 6:0:-3]),
]


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
@pytest.mark.parametrize("name,shape,fn", PY_SLICES, ids=[p[0] for p in PY_SLICES])
def test_python_slicing(tf, dtype, name, shape, fn):
    x = rand(np.random.default_rng(1), shape, dtype)
    with ran_on_gpu("StridedSlice"):
        g, c = both(tf, fn, x)
    assert on_gpu(g)
    same(g, c)


def test_strided_slice_random_masks_match_cpu_values_and_errors(tf):
    rng = np.random.default_rng(2)
    x = rand(rng, (3, 4, 5), "float32")
    tried = ok = 0
    for _ in range(150):
        n = int(rng.integers(1, 5))
        begin = rng.integers(-6, 7, n).tolist()
        end = rng.integers(-6, 7, n).tolist()
        strides = [int(s) if s != 0 else 1 for s in rng.integers(-3, 4, n)]
        masks = {k: int(rng.integers(0, 1 << n)) if rng.random() < 0.5 else 0
                 for k in ("begin_mask", "end_mask", "new_axis_mask", "shrink_axis_mask")}
        masks["ellipsis_mask"] = int(1 << rng.integers(0, n)) if rng.random() < 0.3 else 0

        def f(t):
            return tf.raw_ops.StridedSlice(input=t, begin=begin, end=end, strides=strides, **masks)

        results = []
        for dev in ("/GPU:0", "/CPU:0"):
            try:
                with tf.device(dev):
                    results.append(f(tf.constant(x)))
            except tf.errors.InvalidArgumentError as e:
                results.append(e)
        tried += 1
        g, c = results
        if isinstance(c, Exception):
            assert isinstance(g, Exception), f"{begin} {end} {strides} {masks}: CPU fails ({c}), GPU gives {g}"
            continue
        assert not isinstance(g, Exception), f"{begin} {end} {strides} {masks}: {g}"
        assert on_gpu(g)
        same(g, c)
        ok += 1
    assert ok > 50, (ok, tried)


def test_strided_slice_gradient(tf):
    rng = np.random.default_rng(3)
    for dtype in ("float32", "float16"):
        x = rand(rng, (6, 3, 5), dtype)
        w = rand(rng, (2, 3, 3), dtype)

        def loss(t):
            with tf.GradientTape() as tape:
                tape.watch(t)
                y = tf.reduce_sum(t[1:-1:2, ..., ::-2] * w)
            return tape.gradient(y, t)

        with ran_on_gpu("StridedSliceGrad"):
            g, c = both(tf, loss, x)
        assert on_gpu(g)
        same(g, c)


# ------------------------------------------------------------------ Slice

@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_tf_slice(tf, dtype):
    rng = np.random.default_rng(4)
    for shape, begin, size in [((7,), [2], [5]), ((3, 129), [1, 7], [2, -1]), ((2, 3, 5), [0, 1, 2], [2, 0, 3]),
                               ((4, 1, 3), [3, 0, 0], [1, 1, -1])]:
        x = rand(rng, shape, dtype)
        with ran_on_gpu("Slice"):
            g, c = both(tf, lambda t: tf.slice(t, begin, size), x)
        assert on_gpu(g)
        same(g, c)


def test_tf_slice_gradient(tf):
    x = rand(np.random.default_rng(5), (5, 7), "float32")

    def grad(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            y = tf.reduce_sum(tf.slice(t, [1, 2], [3, 4]) ** 2)
        return tape.gradient(y, t)

    with ran_on_gpu("Slice"):
        g, c = both(tf, grad, x)
    same(g, c)


# ------------------------------------------------------------------ Pad, PadV2, MirrorPad

@pytest.mark.parametrize("dtype", MOVE_DTYPES)
@pytest.mark.parametrize("mode", ["CONSTANT", "REFLECT", "SYMMETRIC"])
def test_tf_pad_modes(tf, dtype, mode):
    rng = np.random.default_rng(6)
    for shape, pads in [((5,), [[2, 3]]), ((3, 7), [[1, 2], [0, 3]]), ((2, 3, 4), [[1, 1], [2, 0], [3, 3]]),
                        ((1, 3), [[0, 0], [2, 1]])]:
        if mode == "REFLECT":
            pads = [[min(b, d - 1), min(a, d - 1)] for (b, a), d in zip(pads, shape)]
        if mode == "SYMMETRIC":
            pads = [[min(b, d), min(a, d)] for (b, a), d in zip(pads, shape)]
        x = rand(rng, shape, dtype)
        op = {"CONSTANT": "Pad", "REFLECT": "MirrorPad", "SYMMETRIC": "MirrorPad"}[mode]
        with ran_on_gpu(op):
            g, c = both(tf, lambda t: tf.pad(t, pads, mode=mode), x)
        assert on_gpu(g)
        same(g, c)
    if mode == "CONSTANT":
        x = rand(rng, (3, 5), dtype)
        value = x.flat[0] if x.flat[0] != 0 else np.ones((), dtype)  # PadV2 needs a nonzero value
        with ran_on_gpu("PadV2"):
            g, c = both(tf, lambda t: tf.pad(t, [[1, 0], [2, 3]], constant_values=value), x)
        same(g, c)


@pytest.mark.parametrize("mode", ["CONSTANT", "REFLECT", "SYMMETRIC"])
def test_tf_pad_gradients(tf, mode):
    rng = np.random.default_rng(7)
    for dtype, tol in [("float32", 1e-6), ("float16", 1e-3)]:
        x = rand(rng, (4, 5, 3), dtype)
        w = rand(rng, (7, 8, 3), dtype)

        def grad(t):
            with tf.GradientTape() as tape:
                tape.watch(t)
                y = tf.reduce_sum(tf.pad(t, [[1, 2], [3, 0], [0, 0]], mode=mode) * w)
            return tape.gradient(y, t)

        op = "MirrorPadGrad" if mode != "CONSTANT" else "Slice"
        with ran_on_gpu(op):
            g, c = both(tf, grad, x)
        assert on_gpu(g)
        assert g.dtype == c.dtype and g.shape == c.shape
        np.testing.assert_allclose(g.numpy().astype(np.float32), c.numpy().astype(np.float32), rtol=tol, atol=tol)


# ------------------------------------------------------------------ GatherV2

@pytest.mark.parametrize("dtype", MOVE_DTYPES + ["int32"])
def test_tf_gather(tf, dtype):
    rng = np.random.default_rng(8)
    cases = [((7,), (5,), 0, 0), ((5, 3), (2, 3), 1, 0), ((5, 3), (4,), -2, 0), ((3, 5, 2), (3, 4), 1, 1),
             ((2, 3, 5, 3), (2, 3, 2), 2, 2), ((2, 4, 3), (), 1, 0)]
    for pshape, ishape, axis, bd in cases:
        x = rand(rng, pshape, dtype)
        n = pshape[axis]
        for idt in (np.int32, np.int64):
            idx = rng.integers(0, n, ishape).astype(idt)
            # int32 params are shape arithmetic: the runtime's host kernel on GPU:0 (as on CUDA).
            with (ran_on_host if dtype == "int32" else ran_on_gpu)("GatherV2"):
                g, c = both(tf, lambda p, i: tf.gather(p, i, axis=axis, batch_dims=bd), x, idx)
            assert on_gpu(g)
            same(g, c)


def test_gather_out_of_range_gives_zeros_like_tensorflow_gpu(tf):
    x = np.arange(12, dtype=np.float32).reshape(4, 3) + 1
    with tf.device("/GPU:0"):
        g = tf.gather(tf.constant(x), tf.constant([1, 4, -1, 0]))
    np.testing.assert_array_equal(g.numpy(), np.stack([x[1], np.zeros(3), np.zeros(3), x[0]]))


def test_gather_gradient(tf):
    rng = np.random.default_rng(9)
    x = rand(rng, (6, 4), "float32")
    idx = np.array([0, 5, 2, 2], np.int32)

    def grad(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            y = tf.reduce_sum(tf.gather(t, idx) ** 2)
        return tf.convert_to_tensor(tape.gradient(y, t))

    with ran_on_gpu("GatherV2"):
        g, c = both(tf, grad, x)
    np.testing.assert_allclose(g.numpy(), c.numpy(), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ OneHot

@pytest.mark.parametrize("dtype", MOVE_DTYPES + ["int32"])
def test_tf_one_hot(tf, dtype):
    rng = np.random.default_rng(10)
    on, off = rand(rng, (2,), dtype)
    if dtype == "bool":
        on, off = True, False
    for shape, depth, axis in [((7,), 5, -1), ((3, 5), 4, 0), ((2, 3), 3, 1), ((), 6, -1), ((4,), 0, -1)]:
        for idt in (np.uint8, np.int32, np.int64):
            idx = rng.integers(-1 if idt != np.uint8 else 0, depth + 2, shape).astype(idt)
            with ran_on_gpu("OneHot"):
                g, c = both(tf, lambda i: tf.one_hot(i, depth, on_value=on, off_value=off, axis=axis, dtype=dtype), idx)
            assert on_gpu(g)
            same(g, c)


# ------------------------------------------------------------------ MatrixBandPart

@pytest.mark.parametrize("dtype", MOVE_DTYPES + ["int32"])
def test_band_part(tf, dtype):
    """`tf.linalg.band_part` (Keras's causal masks): every band, batch dimensions, packed
    dtypes with odd sizes, bounds as int32 and int64, and TensorFlow's errors."""
    rng = np.random.default_rng(14)
    for shape in [(5, 7), (3, 4, 3), (2, 1, 9, 2), (0, 4), (3, 3)]:
        x = rand(rng, shape, dtype)
        for lower, upper in [(-1, 0), (0, -1), (2, 1), (0, 0), (-1, -1), (1, 3)]:
            lower, upper = min(lower, shape[-2]), min(upper, shape[-1])
            for idt in (np.int32, np.int64):
                lo, up = idt(lower), idt(upper)
                with ran_on_gpu("MatrixBandPart") if x.size else contextlib.nullcontext():
                    g, c = both(tf, lambda v: tf.linalg.band_part(v, lo, up), x)
                assert on_gpu(g)
                same(g, c)
    for args in [(np.zeros(3, dtype), 0, 0), (np.zeros((2, 3), dtype), 3, 0), (np.zeros((2, 3), dtype), 0, 4)]:
        same_error(tf, lambda: tf.linalg.band_part(tf.constant(args[0]), args[1], args[2]))


def test_causal_attention_trains_without_fallback(tf):
    """Keras's MultiHeadAttention with `use_causal_mask=True` builds its mask with
    MatrixBandPart, which had no kernel: the mask went through the CPU every step. Now the whole
    step runs on the GPU and reads nothing back mid-step; losses are the CPU's."""
    import keras
    import tensorflow_wgpu

    rng = np.random.default_rng(15)
    x = rng.standard_normal((4, 6, 8)).astype(np.float32)
    y = rng.standard_normal((4, 6, 8)).astype(np.float32)
    res = {}
    for device in ["/CPU:0", "/GPU:0"]:
        with tf.device(device):
            keras.utils.set_random_seed(2)
            inp = keras.Input((6, 8))
            model = keras.Model(inp, keras.layers.MultiHeadAttention(2, 4)(inp, inp, use_causal_mask=True))

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
            bands = s1["gpu_ops"].get("MatrixBandPart", 0) - s0["gpu_ops"].get("MatrixBandPart", 0)
            res[device] = (loss.numpy(), [g.numpy() for g in grads], reads, bands)
    loss, grads, reads, bands = res["/GPU:0"]
    assert bands >= 1 and reads == 0, (bands, reads)
    np.testing.assert_allclose(loss, res["/CPU:0"][0], rtol=1e-5)
    for g, w in zip(grads, res["/CPU:0"][1]):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ Range

def test_tf_range(tf):
    for args, dtype in [((0, 10, 1), tf.int64), ((-7, 100, 3), tf.int64), ((100, -7, -9), tf.int64),
                        ((0.0, 10.0, 0.5), tf.float32), ((3.5, -2.25, -0.75), tf.float32), ((1.0, 1.0, 1.0), tf.float32)]:
        with ran_on_gpu("Range"):
            with tf.device("/GPU:0"):
                g = tf.range(*args, dtype=dtype)
        with tf.device("/CPU:0"):
            c = tf.range(*args, dtype=dtype)
        assert on_gpu(g)
        same(g, c)
    # Long float ranges: start + i * delta on the GPU, an accumulated sum on TensorFlow's CPU.
    with tf.device("/GPU:0"):
        g = tf.range(0.0, 100.0, 0.1)
    with tf.device("/CPU:0"):
        c = tf.range(0.0, 100.0, 0.1)
    assert g.shape == c.shape
    np.testing.assert_allclose(g.numpy(), np.arange(1000) * np.float64(np.float32(0.1)), rtol=2e-7, atol=1e-7)
    np.testing.assert_allclose(g.numpy(), c.numpy(), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ Erf, Erfc

@pytest.mark.parametrize("op", ["erf", "erfc"])
def test_erf_erfc(tf, op):
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(-5, 5, 1001), [0.0, -0.0, 0.5, 2.0, 9.0, 11.0, np.inf, -np.inf, np.nan]]).astype(np.float32)
    f = getattr(tf.math, op)
    with ran_on_gpu(op.capitalize()):
        g, c = both(tf, f, x)
    assert on_gpu(g)
    # Against the exact value (float64 math.erf/erfc): within 4 ULP of float32.
    import math

    exact = np.array([getattr(math, op)(float(v)) for v in x])
    finite = np.isfinite(exact)
    err = np.abs(g.numpy()[finite].astype(np.float64) - exact[finite])
    ulps = np.spacing(np.abs(exact[finite]).astype(np.float32)).astype(np.float64)
    assert np.all(err <= 4 * np.maximum(ulps, 1.4e-45)), np.max(err / ulps)
    # Against TensorFlow's CPU kernel, whose float32 erfc is itself up to ~8 ULP off (Eigen's
    # approximation): the sum of both bounds.
    np.testing.assert_allclose(g.numpy(), c.numpy(), rtol=1.5e-6, atol=1e-37)
    g16, c16 = both(tf, f, x.astype(np.float16))
    assert on_gpu(g16)
    np.testing.assert_allclose(g16.numpy().astype(np.float32), c16.numpy().astype(np.float32), rtol=1e-3, atol=1e-7)

    def grad(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            y = tf.reduce_sum(f(t))
        return tape.gradient(y, t)

    gg, cg = both(tf, grad, x[:1001])
    np.testing.assert_allclose(gg.numpy(), cg.numpy(), rtol=1e-5, atol=1e-30)


# ------------------------------------------------------------------ UnsortedSegmentSum

@pytest.mark.parametrize("idt", [np.int32, np.int64])
def test_unsorted_segment_sum(tf, idt):
    """float32 rows summed per id on the GPU (atomic adds in the GPU's order, as TensorFlow's GPU
    kernel): TensorFlow's CPU sums within float32 rounding of a sum of that many terms; negative
    ids drop their rows on both."""
    rng = np.random.default_rng(12)
    for dshape, irank, n in [((50,), 1, 7), ((40, 5), 1, 9), ((4, 6, 3), 2, 11), ((30, 2), 1, 1)]:
        x = rng.standard_normal(dshape).astype(np.float32)
        ids = rng.integers(-1, n, dshape[:irank]).astype(idt)
        with ran_on_gpu("UnsortedSegmentSum"):
            g, c = both(tf, lambda d, i: tf.math.unsorted_segment_sum(d, i, n), x, ids)
        assert on_gpu(g) and g.shape == c.shape
        # Up to 50 terms of |x| < ~4: (k - 1) * eps * sum |x| bounds any order's rounding.
        np.testing.assert_allclose(g.numpy(), c.numpy(), rtol=0, atol=50 * 4 * 50 * 1.2e-7)


def test_embedding_gradient_sums_on_the_gpu(tf):
    """Keras's Embedding layer: its gradient is sparse rows, which the optimizer sums per token
    (UnsortedSegmentSum) before its dense update. That sum used to run on the CPU, copying the
    rows and ids to the host (two reads that wait for the GPU) every step; now it runs on the
    GPU, and Keras's remap of negative ids (an int32 SelectV2 of the host's ids, which a
    host-memory Reshape takes) runs on the host: a step reads back only the loss. The losses
    track TensorFlow's CPU."""
    import keras

    import tensorflow_wgpu

    rng = np.random.default_rng(4)
    x = rng.integers(0, 50, (64, 12)).astype(np.int32)
    y = (x[:, 0] % 2).astype(np.float32)
    losses = {}
    for device in ["/GPU:0", "/CPU:0"]:
        with tf.device(device):
            keras.utils.set_random_seed(2)
            m = keras.Sequential([keras.Input((12,), dtype="int32"), keras.layers.Embedding(50, 8),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
            m.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.BinaryCrossentropy(from_logits=True))
            m.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
            s0 = tensorflow_wgpu.stats()["runtime"]["reads"]
            ctx = ran_on_gpu("UnsortedSegmentSum") if device == "/GPU:0" else contextlib.nullcontext()
            with ctx:
                h = m.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
            s1 = tensorflow_wgpu.stats()["runtime"]["reads"]
            losses[device] = (h.history["loss"], s1 - s0)
    (g, reads), (c, _) = losses["/GPU:0"], losses["/CPU:0"]
    steps = 2 * 4
    assert reads <= steps + 2, reads  # with the sum on the CPU and the remap on the GPU: 4 per step
    np.testing.assert_allclose(g, c, rtol=1e-4)


# ------------------------------------------------------------------ SpaceToBatchND / BatchToSpaceND

SPACE_CASES = [
    ((2, 6, 4, 3), [2, 2], [[0, 0], [0, 0]]),
    ((1, 5, 7, 2), [2, 3], [[1, 0], [2, 0]]),
    ((3, 4, 1), [2], [[1, 1]]),
    ((2, 3, 4, 5, 2), [1, 2, 1], [[0, 0], [1, 1], [0, 0]]),
    ((2, 4, 4, 2), [1, 1], [[0, 0], [0, 0]]),
    ((2, 1, 6, 2), [1, 3], [[0, 0], [0, 0]]),
    ((0, 4, 4, 1), [2, 2], [[0, 0], [0, 0]]),
]


@pytest.mark.parametrize("dtype", MOVE_DTYPES + ["int32"])
@pytest.mark.parametrize("shape,block,pads", SPACE_CASES, ids=str)
def test_space_to_batch_and_back(tf, dtype, shape, block, pads):
    """TensorFlow's atrous convolutions move blocks of space into the batch and back: every
    element lands where TensorFlow's CPU kernel puts it (padding zeros, crops), trivial block
    dims merged as TensorFlow merges them."""
    rng = np.random.default_rng(sum(shape))
    x = rand(rng, shape, dtype)
    for idt in (np.int32, np.int64):
        b, p = np.array(block, idt), np.array(pads, idt)
        with ran_on_gpu("SpaceToBatchND") if x.size else contextlib.nullcontext():
            g, c = both(tf, lambda v: tf.space_to_batch_nd(v, b, p), x)
        same(g, c)
        with ran_on_gpu("BatchToSpaceND") if x.size else contextlib.nullcontext():
            g2, c2 = both(tf, lambda v: tf.batch_to_space(v, b, p), c.numpy())
        same(g2, c2)


@pytest.mark.parametrize(
    "call",
    [
        lambda tf: tf.space_to_batch_nd(tf.zeros([1, 5, 4, 1]), [2, 2], [[0, 0], [0, 0]]),
        lambda tf: tf.space_to_batch_nd(tf.zeros([1, 4, 4, 1]), [2, 2], [[0, -2], [0, 0]]),
        lambda tf: tf.space_to_batch_nd(tf.zeros([1, 4, 4, 1]), [2, 0], [[0, 0], [0, 0]]),
        lambda tf: tf.space_to_batch_nd(tf.zeros([1, 4, 4, 1]), [2, 2], [[0, 0]]),
        lambda tf: tf.batch_to_space(tf.zeros([3, 2, 2, 1]), [2, 2], [[0, 0], [0, 0]]),
        lambda tf: tf.batch_to_space(tf.zeros([4, 2, 2, 1]), [2, 2], [[3, 2], [0, 0]]),
    ],
)
def test_space_to_batch_errors_are_tensorflows(tf, call):
    same_error(tf, lambda: call(tf))


def test_dilated_convolutions_train_without_fallback(tf):
    """Keras's dilated DepthwiseConv2D runs as SpaceToBatchND, the depthwise convolution and
    BatchToSpaceND: all on the GPU now (the two data movements, which had no kernel, went to
    the CPU with the activations every step); losses track the CPU's."""
    import keras
    import tensorflow_wgpu

    rng = np.random.default_rng(6)
    x = rng.standard_normal((16, 12, 12, 3)).astype(np.float32)
    y = rng.integers(0, 4, 16).astype(np.int32)
    losses = {}
    for device in ["/CPU:0", "/GPU:0"]:
        with tf.device(device):
            keras.utils.set_random_seed(7)
            m = keras.Sequential([
                keras.Input((12, 12, 3)),
                keras.layers.DepthwiseConv2D(3, dilation_rate=2, padding="same"),
                keras.layers.Conv2D(4, 3, dilation_rate=2),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(4),
            ])
            m.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
            ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
            m.fit(ds, epochs=1, verbose=0)
            before = tensorflow_wgpu.stats()
            h = m.fit(ds, epochs=1, verbose=0)
            after = tensorflow_wgpu.stats()
            losses[device] = h.history["loss"][0]
    runs = {k: after["gpu_ops"].get(k, 0) - before["gpu_ops"].get(k, 0) for k in ("SpaceToBatchND", "BatchToSpaceND")}
    assert runs["SpaceToBatchND"] >= 2 and runs["BatchToSpaceND"] >= 2, runs
    reads = after["runtime"]["reads"] - before["runtime"]["reads"]
    # Two steps: the loss each step, and once more at the epoch's end.
    assert reads <= 2 + 2, reads
    np.testing.assert_allclose(losses["/GPU:0"], losses["/CPU:0"], rtol=1e-5)


@pytest.mark.parametrize("idt", [np.int32, np.int64])
@pytest.mark.parametrize("dtype", ["float32", "int32", "int64"])
def test_scatter_nd(tf, dtype, idt):
    """ScatterNd against the CPU: K = 1, 2, 3 index components, slices, repeated indices (their
    updates summed; float32 values are small integers, so every order of the atomic sums is
    exact)."""
    rng = np.random.default_rng(3)
    cases = [
        ([40, 1], [7, 3]),  # rows of a [7, 3] matrix
        ([64, 2], [5, 6]),  # elements of a matrix (a confusion matrix)
        ([30, 3], [4, 3, 5, 2]),  # slices of the last dimension
        ([2, 9, 2], [3, 4, 6]),  # batched indices
    ]
    for ishape, shape in cases:
        k = ishape[-1]
        idx = np.stack([rng.integers(0, shape[j], ishape[:-1]) for j in range(k)], axis=-1).astype(idt)
        upd = rng.integers(-5, 6, ishape[:-1] + shape[k:]).astype(dtype)
        if dtype == "int64":
            # Carries between the two words, both ways: values around +-2^32.
            upd = upd * (1 << 31) + rng.integers(-(1 << 31), 1 << 31, upd.shape)
        want = None
        for dev in ["/CPU:0", "/GPU:0"]:
            with tf.device(dev), ran_on_gpu("ScatterNd") if dev == "/GPU:0" else contextlib.nullcontext():
                got = tf.scatter_nd(tf.constant(idx), tf.constant(upd), tf.constant(shape, idt)).numpy()
            if want is None:
                want = got
        np.testing.assert_array_equal(got, want, err_msg=f"{ishape} {shape}")


def test_scatter_nd_float_sums_and_dropped_indices(tf):
    """Random float32 updates summed at repeated indices: the GPU adds in its own order
    (TensorFlow's GPU kernel too), within float32 rounding of the CPU's order. An index outside
    the shape drops its update, as TensorFlow's GPU kernel does (its CPU kernel refuses it)."""
    rng = np.random.default_rng(4)
    idx = rng.integers(0, 6, (500, 1)).astype(np.int32)
    upd = rng.standard_normal((500, 3)).astype(np.float32)
    with tf.device("/CPU:0"):
        want = tf.scatter_nd(idx, upd, [6, 3]).numpy()
    with tf.device("/GPU:0"):
        got = tf.scatter_nd(idx, upd, [6, 3]).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    bad = np.array([[1], [9], [-1], [2]], np.int32)
    with tf.device("/GPU:0"):
        got = tf.scatter_nd(bad, np.ones((4, 2), np.float32), [3, 2]).numpy()
    np.testing.assert_array_equal(got, [[0, 0], [1, 1], [1, 1]])


def test_mean_iou_metric_runs_on_the_gpu(tf):
    """Keras's MeanIoU (its confusion matrix: an int64 ScatterNd) in `fit` on the GPU: the
    metric has the CPU's value and the step no longer copies the predictions to the host."""
    import keras

    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    y = rng.integers(0, 3, 64).astype(np.int32)
    vals = {}
    for dev in ["/GPU:0", "/CPU:0"]:
        with tf.device(dev):
            keras.utils.set_random_seed(6)
            m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
            m.compile(
                optimizer="sgd",
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=[keras.metrics.MeanIoU(num_classes=3, sparse_y_pred=False, name="iou")],
            )
            with ran_on_gpu("ScatterNd") if dev == "/GPU:0" else contextlib.nullcontext():
                h = m.fit(x, y, epochs=2, batch_size=16, shuffle=False, verbose=0)
            vals[dev] = h.history["iou"]
    np.testing.assert_allclose(vals["/GPU:0"], vals["/CPU:0"], rtol=1e-6)
