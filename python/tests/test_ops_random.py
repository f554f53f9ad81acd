"""Random family through TensorFlow: the Philox random ops, the bit ops and Bitcast on GPU:0
against TensorFlow's own CPU kernels, and Keras's seeded layers and initializers.

Uniform floats and integers must be bit-identical to the CPU; normal and truncated normal
values within a few ULP (TensorFlow's CPU kernels call libm's log and sincos, the shader
computes them by argument reduction and series). Random ops and bit ops have no gradients,
so there are no GradientTape checks here.
"""
import ctypes
import json

import numpy as np
import pytest

from conftest import on_gpu


def gpu_ops():
    """The plugin's count of kernel executions per op on tfwgpu devices."""
    import tensorflow_wgpu

    lib = tensorflow_wgpu._plugin()
    lib.tfwgpu_stats_json.restype = ctypes.c_char_p
    return json.loads(lib.tfwgpu_stats_json().decode())["gpu_ops"]


class RanOnGpu:
    """Asserts that `op` ran on a tfwgpu device inside the block (at least `n` times)."""

    def __init__(self, op, n=1):
        self.op, self.n = op, n

    def __enter__(self):
        self.before = gpu_ops().get(self.op, 0)
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            ran = gpu_ops().get(self.op, 0) - self.before
            assert ran >= self.n, f"{self.op} ran {ran} times on the GPU, expected {self.n}"


def assert_random_equal(g, c, kind):
    """Exact for uniform and integer values, a few ULP for Box-Muller values."""
    g, c = np.asarray(g), np.asarray(c)
    assert g.dtype == c.dtype and g.shape == c.shape
    if kind in ("uniform", "int"):
        np.testing.assert_array_equal(g, c)
    else:
        np.testing.assert_array_max_ulp(g, c, maxulp=1 if g.dtype == np.float16 else 4)


SHAPES = [[0], [7], [3, 43], [2, 1, 5]]
V1_OPS = [
    ("StatelessRandomUniform", "uniform"),
    ("StatelessRandomNormal", "normal"),
    ("StatelessTruncatedNormal", "normal"),
]


@pytest.mark.parametrize("op,kind", V1_OPS, ids=[o for o, _ in V1_OPS])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("seed_dtype", ["int32", "int64"])
def test_stateless_float_ops_match_cpu(tf, op, kind, dtype, seed_dtype):
    fn = getattr(tf.raw_ops, op)
    for i, shape in enumerate(SHAPES):
        seed = tf.constant([1234 + i, -77 * i], dtype=seed_dtype)
        with RanOnGpu(op, n=0 if 0 in shape else 1):
            with tf.device("/GPU:0"):
                g = fn(shape=shape, seed=seed, dtype=dtype)
        with tf.device("/CPU:0"):
            c = fn(shape=shape, seed=seed, dtype=dtype)
        assert on_gpu(g)
        assert_random_equal(g, c, kind)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_stateless_int_ops_match_cpu(tf, dtype):
    bounds = [(-5, 7), (-(2**31), 2**31 - 1)] if dtype == "int32" else [(-5, 7), (-(2**63), 2**63 - 1), (3, 2**40)]
    for lo, hi in bounds:
        args = dict(shape=[3, 9], seed=tf.constant([5, 6], tf.int64),
                    minval=tf.constant(lo, dtype), maxval=tf.constant(hi, dtype))
        with RanOnGpu("StatelessRandomUniformInt"):
            with tf.device("/GPU:0"):
                g = tf.raw_ops.StatelessRandomUniformInt(**args)
        with tf.device("/CPU:0"):
            c = tf.raw_ops.StatelessRandomUniformInt(**args)
        assert on_gpu(g)
        assert_random_equal(g, c, "int")
    args = dict(shape=[13], seed=tf.constant([9, 10], tf.int32), dtype=dtype)
    with RanOnGpu("StatelessRandomUniformFullInt"):
        with tf.device("/GPU:0"):
            g = tf.raw_ops.StatelessRandomUniformFullInt(**args)
    with tf.device("/CPU:0"):
        c = tf.raw_ops.StatelessRandomUniformFullInt(**args)
    assert_random_equal(g, c, "int")


def test_seeded_v1_ops_on_gpu_equal_the_public_api(tf):
    # tf.random.stateless_* derive key and counter from the seed exactly as the V1 ops do
    # inside, so the GPU's V1 op and the public API on the CPU give the same numbers.
    seed = [17, 42]
    with tf.device("/GPU:0"):
        u = tf.raw_ops.StatelessRandomUniform(shape=[5, 6], seed=seed, dtype=tf.float32)
        n = tf.raw_ops.StatelessRandomNormal(shape=[5, 6], seed=seed, dtype=tf.float32)
        t = tf.raw_ops.StatelessTruncatedNormal(shape=[5, 6], seed=seed, dtype=tf.float32)
    with tf.device("/CPU:0"):
        assert_random_equal(u, tf.random.stateless_uniform([5, 6], seed=seed), "uniform")
        assert_random_equal(n, tf.random.stateless_normal([5, 6], seed=seed), "normal")
        assert_random_equal(t, tf.random.stateless_truncated_normal([5, 6], seed=seed), "normal")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_public_stateless_api_matches_cpu(tf, dtype):
    for fn, kind in [(tf.random.stateless_uniform, "uniform"),
                     (tf.random.stateless_normal, "normal"),
                     (tf.random.stateless_truncated_normal, "normal")]:
        with tf.device("/GPU:0"):
            g = fn([4, 33], seed=[3, 4], dtype=dtype)
        with tf.device("/CPU:0"):
            c = fn([4, 33], seed=[3, 4], dtype=dtype)
        assert_random_equal(g, c, kind)
    with tf.device("/GPU:0"):
        g = tf.random.stateless_uniform([50], seed=[3, 4], minval=-4, maxval=99, dtype=tf.int32)
    with tf.device("/CPU:0"):
        c = tf.random.stateless_uniform([50], seed=[3, 4], minval=-4, maxval=99, dtype=tf.int32)
    assert_random_equal(g, c, "int")


@pytest.mark.parametrize("fn,op", [
    ("stateless_uniform", "StatelessRandomUniformV2"),
    ("stateless_normal", "StatelessRandomNormalV2"),
    ("stateless_truncated_normal", "StatelessTruncatedNormalV2"),
])
def test_public_stateless_api_runs_on_gpu_and_matches_cpu(tf, fn, op):
    """tf.random.stateless_*: the key and counter come from the plugin's host kernel
    (StatelessRandomGetKeyCounter), the values from the GPU, equal to the CPU's (uniform
    bit for bit; normal within a few ulp of libm's log/sincos)."""
    import tensorflow_wgpu

    f = getattr(tf.random, fn)
    with RanOnGpu(op):
        with tf.device("/GPU:0"):
            g = f([3, 129], seed=[3, 4]).numpy()
    with tf.device("/CPU:0"):
        c = f([3, 129], seed=[3, 4]).numpy()
        kc = tf.raw_ops.StatelessRandomGetKeyCounter(seed=tf.constant([3, 4], tf.int64))
    with tf.device("/GPU:0"):
        before = tensorflow_wgpu.stats()["host_ops"].get("StatelessRandomGetKeyCounter", 0)
        kg = tf.raw_ops.StatelessRandomGetKeyCounter(seed=tf.constant([3, 4], tf.int64))
        after = tensorflow_wgpu.stats()["host_ops"].get("StatelessRandomGetKeyCounter", 0)
    assert after == before + 1
    assert kg[0].dtype == tf.uint64 and kg[0].numpy().tolist() == kc[0].numpy().tolist()
    assert kg[1].numpy().tolist() == kc[1].numpy().tolist()
    if fn == "stateless_uniform":
        np.testing.assert_array_equal(g, c)
    else:
        np.testing.assert_allclose(g, c, rtol=4 * 2.0**-23, atol=4 * 2.0**-23)


STATEFUL = [
    ("RandomUniform", dict(dtype="float32"), "uniform"),
    ("RandomUniform", dict(dtype="float16"), "uniform"),
    ("RandomStandardNormal", dict(dtype="float32"), "normal"),
    ("TruncatedNormal", dict(dtype="float32"), "normal"),
    ("TruncatedNormal", dict(dtype="float16"), "normal"),
    ("RandomUniformInt", dict(minval=-3, maxval=1000, Tout="int32"), "int"),
    ("RandomUniformInt", dict(minval=-(2**62), maxval=2**62, Tout="int64"), "int"),
]


@pytest.mark.parametrize("i", range(len(STATEFUL)), ids=[f"{o}-{list(a.values())[-1]}" for o, a, _ in STATEFUL])
def test_stateful_ops_match_cpu_call_after_call(tf, i):
    op, attrs, kind = STATEFUL[i]
    fn = getattr(tf.raw_ops, op)
    # Seeds unique to this test: eager mode caches one kernel per device, op and attributes,
    # and that kernel's generator advances with every call.
    seed, seed2 = 1000 + i, 77

    def call():
        kw = dict(attrs)
        if "Tout" in kw:
            t = kw.pop("Tout")
            kw["minval"] = tf.constant(kw["minval"], t)
            kw["maxval"] = tf.constant(kw["maxval"], t)
        return fn(shape=[3, 7], seed=seed, seed2=seed2, **kw)

    with RanOnGpu(op, n=3):
        with tf.device("/GPU:0"):
            g = [call() for _ in range(3)]
    with tf.device("/CPU:0"):
        c = [call() for _ in range(3)]
    assert on_gpu(g[0])
    assert not np.array_equal(g[0].numpy(), g[1].numpy()), "the generator advanced"
    for a, b in zip(g, c):
        assert_random_equal(a, b, kind)


def test_unseeded_random_uniform_runs_on_gpu(tf):
    with RanOnGpu("RandomUniform"):
        with tf.device("/GPU:0"):
            x = tf.random.uniform([1000])
    v = x.numpy()
    assert on_gpu(x) and v.min() >= 0 and v.max() < 1 and 0.4 < v.mean() < 0.6


rng = np.random.default_rng(11)


def ints(dtype, shape, lo=None, hi=None):
    info = np.iinfo(dtype)
    lo = info.min if lo is None else lo
    hi = info.max if hi is None else hi
    return rng.integers(lo, hi, size=shape, dtype=dtype, endpoint=True)


BIT_OPS = ["bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"]
RAW_NAMES = {"bitwise_and": "BitwiseAnd", "bitwise_or": "BitwiseOr", "bitwise_xor": "BitwiseXor",
             "left_shift": "LeftShift", "right_shift": "RightShift"}


@pytest.mark.parametrize("name", BIT_OPS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_bit_ops_match_cpu(tf, name, dtype):
    fn = getattr(tf.bitwise, name)
    bits = np.iinfo(dtype).bits
    for sa, sb in [((7,), (7,)), ((), (129,)), ((3, 1), (1, 5)), ((0, 3), (1, 3)), ((2, 3, 4), (4,))]:
        a = ints(dtype, sa)
        if name.endswith("shift"):
            # Amounts past the width and negative amounts are clamped by TensorFlow.
            lo = -3 if np.iinfo(dtype).min < 0 else 0
            b = ints(dtype, sb, lo, bits + 5)
        else:
            b = ints(dtype, sb)
        with RanOnGpu(RAW_NAMES[name], n=0 if 0 in sa else 1):
            with tf.device("/GPU:0"):
                g = fn(tf.constant(a), tf.constant(b))
        with tf.device("/CPU:0"):
            c = fn(tf.constant(a), tf.constant(b))
        assert on_gpu(g)
        assert g.dtype == c.dtype and g.shape == c.shape
        np.testing.assert_array_equal(g.numpy(), c.numpy())


@pytest.mark.parametrize("src,dst,shape", [
    (np.float32, "int32", (3, 5)),
    (np.int64, "int32", (4,)),
    (np.int64, "float16", (2, 3)),
    (np.uint8, "float32", (3, 4)),
    (np.float16, "int64", (2, 4)),
    (np.int32, "uint8", (0, 2)),
])
def test_bitcast_matches_cpu(tf, src, dst, shape):
    if np.issubdtype(src, np.integer):
        x = ints(src, shape)
    else:
        x = rng.standard_normal(shape).astype(src)
    with RanOnGpu("Bitcast", n=0 if 0 in shape else 1):
        with tf.device("/GPU:0"):
            g = tf.bitcast(tf.constant(x), dst)
    with tf.device("/CPU:0"):
        c = tf.bitcast(tf.constant(x), dst)
    assert on_gpu(g)
    assert g.dtype == c.dtype and g.shape == c.shape
    np.testing.assert_array_equal(g.numpy().view(np.uint8), c.numpy().view(np.uint8))


def test_keras_dropout_matches_cpu(tf):
    import keras

    x = rng.standard_normal((4, 37)).astype(np.float32)
    outs = []
    for dev in ["/GPU:0", "/CPU:0"]:
        with tf.device(dev):
            layer = keras.layers.Dropout(0.4, seed=1234)
            outs.append([layer(tf.constant(x), training=True).numpy() for _ in range(2)])
    for g, c in zip(*outs):
        np.testing.assert_array_equal(g, c)
    assert not np.array_equal(outs[0][0], outs[0][1]), "the seed generator advanced"


@pytest.mark.parametrize("init", ["GlorotUniform", "HeNormal", "RandomUniform", "RandomNormal", "TruncatedNormal"])
def test_keras_initializers_match_cpu(tf, init):
    import keras

    outs = []
    for dev in ["/GPU:0", "/CPU:0"]:
        with tf.device(dev):
            outs.append(getattr(keras.initializers, init)(seed=7)((17, 9)).numpy())
    kind = "uniform" if "Uniform" in init else "normal"
    assert_random_equal(outs[0], outs[1], kind)
