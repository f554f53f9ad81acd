"""Layout ops (Transpose, ConcatV2, Pack, Unpack, Split, SplitV, Tile, BroadcastTo, ReverseV2)
on GPU:0 against CPU:0 through TensorFlow: every registered dtype, awkward shapes, the op
counted on the GPU by the plugin, and gradients through tf.GradientTape."""
import ctypes
import json

import numpy as np
import pytest

from conftest import on_gpu

rng = np.random.default_rng(7)

# Registered dtypes (int32 only where TensorFlow's GPU kernel keeps int32 in device memory).
NO_I32 = ["float32", "float16", "int64", "uint8", "bool"]
ALL = NO_I32 + ["int32"]
UNPACK = ["float32", "float16", "uint8", "bool"]

_lib = None


def gpu_op_counts():
    """Kernel executions per op on tfwgpu devices, as the plugin counts them."""
    global _lib
    if _lib is None:
        import tensorflow_wgpu

        _lib = ctypes.CDLL(str(tensorflow_wgpu.plugin_path()))
        _lib.tfwgpu_stats_json.restype = ctypes.c_char_p
    return json.loads(_lib.tfwgpu_stats_json().decode())["gpu_ops"]


def rand(dtype, shape):
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if dtype == "uint8":
        return rng.integers(0, 256, shape).astype(np.uint8)
    if dtype == "int32":
        return rng.integers(-(2**31), 2**31 - 1, shape).astype(np.int32)
    if dtype == "int64":
        return rng.integers(-(2**62), 2**62, shape).astype(np.int64)
    x = rng.standard_normal(shape).astype(dtype)
    if x.size >= 3:
        flat = x.reshape(-1)
        flat[0], flat[1], flat[2] = np.nan, np.inf, -np.inf
    return x


def check(tf, fn, arrays, ops):
    """Runs fn on GPU:0 and CPU:0; the results must be identical and every op in `ops` must
    have run on the GPU."""
    before = gpu_op_counts()
    with tf.device("/GPU:0"):
        g = fn(*[tf.constant(a) for a in arrays])
    after = gpu_op_counts()
    with tf.device("/CPU:0"):
        c = fn(*[tf.constant(a) for a in arrays])
    for op in ops:
        assert after.get(op, 0) > before.get(op, 0), f"{op} did not run on the GPU"
    gs = g if isinstance(g, (list, tuple)) else [g]
    cs = c if isinstance(c, (list, tuple)) else [c]
    assert len(gs) == len(cs)
    for a, b in zip(gs, cs):
        assert on_gpu(a), a.device
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize(
    "shape,perm",
    [((7,), (0,)), ((3, 5), (1, 0)), ((2, 3, 5), (2, 0, 1)), ((3, 0, 2), (1, 2, 0)),
     ((2, 1, 3, 5), (3, 1, 0, 2)), ((2, 3, 1, 2, 3), (4, 3, 2, 1, 0))],
)
def test_transpose(tf, dtype, shape, perm):
    check(tf, lambda x: tf.transpose(x, perm), [rand(dtype, shape)], ["Transpose"])


@pytest.mark.parametrize("dtype", NO_I32)
@pytest.mark.parametrize(
    "shapes,axis",
    [([(3,), (4,)], 0), ([(3, 5), (3, 2), (3, 1)], 1), ([(2, 3), (0, 3), (5, 3)], 0),
     ([(2, 3, 5), (2, 1, 5)], -2), ([(7, 1), (7, 3)], -1)],
)
def test_concat(tf, dtype, shapes, axis):
    arrays = [rand(dtype, s) for s in shapes]
    check(tf, lambda *xs: tf.concat(list(xs), axis), arrays, ["ConcatV2"])


@pytest.mark.parametrize("dtype", NO_I32)
@pytest.mark.parametrize("shape,n,axis", [((), 3, 0), ((5,), 2, 1), ((3, 7), 3, -1), ((2, 0, 3), 2, 1)])
def test_stack(tf, dtype, shape, n, axis):
    arrays = [rand(dtype, shape) for _ in range(n)]
    check(tf, lambda *xs: tf.stack(list(xs), axis), arrays, ["Pack"])


@pytest.mark.parametrize("dtype", UNPACK)
@pytest.mark.parametrize("shape,axis", [((3,), 0), ((4, 5), 1), ((2, 3, 5), -1), ((3, 0), 0)])
def test_unstack(tf, dtype, shape, axis):
    check(tf, lambda x: tf.unstack(x, axis=axis), [rand(dtype, shape)], ["Unpack"])


@pytest.mark.parametrize("dtype", NO_I32)
@pytest.mark.parametrize("shape,num,axis", [((6,), 3, 0), ((4, 9), 3, 1), ((2, 6, 5), 2, -2), ((3, 0), 2, 1)])
def test_split(tf, dtype, shape, num, axis):
    check(tf, lambda x: tf.split(x, num, axis), [rand(dtype, shape)], ["Split"])


@pytest.mark.parametrize("dtype", NO_I32)
@pytest.mark.parametrize(
    "shape,sizes,axis", [((7,), [2, 5], 0), ((4, 9), [1, -1, 3], 1), ((2, 7, 3), [0, 7], -2)]
)
def test_split_sizes(tf, dtype, shape, sizes, axis):
    check(tf, lambda x: tf.split(x, sizes, axis), [rand(dtype, shape)], ["SplitV"])


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize(
    "shape,mult",
    [((3,), (4,)), ((2, 3), (3, 2)), ((1, 5), (7, 1)), ((2, 1, 3), (1, 3, 2)), ((0, 3), (2, 2)),
     ((2, 1, 3, 1), (2, 3, 1, 2))],
)
def test_tile(tf, dtype, shape, mult):
    check(tf, lambda x: tf.tile(x, mult), [rand(dtype, shape)], ["Tile"])


@pytest.mark.parametrize("dtype", NO_I32)
@pytest.mark.parametrize(
    "shape,target", [((), (5,)), ((3,), (4, 3)), ((2, 1), (2, 5)), ((2, 1, 3), (4, 2, 5, 3)), ((1, 3), (0, 3))]
)
def test_broadcast_to(tf, dtype, shape, target):
    check(tf, lambda x: tf.broadcast_to(x, target), [rand(dtype, shape)], ["BroadcastTo"])


@pytest.mark.parametrize("dtype", NO_I32)
@pytest.mark.parametrize(
    "shape,axes", [((7,), [0]), ((3, 5), [1]), ((3, 5), [0, -1]), ((2, 1, 3, 5), [0, 2, 3]), ((0, 3), [0])]
)
def test_reverse(tf, dtype, shape, axes):
    check(tf, lambda x: tf.reverse(x, axes), [rand(dtype, shape)], ["ReverseV2"])


def test_errors_match_cpu(tf):
    """Bad arguments raise InvalidArgumentError on the GPU as on the CPU."""
    x = np.zeros((2, 3), np.float32)
    y = np.zeros((2, 4), np.float32)
    for dev in ("/GPU:0", "/CPU:0"):
        with tf.device(dev):
            with pytest.raises(tf.errors.InvalidArgumentError):
                tf.concat([tf.constant(x), tf.constant(y)], 0)
            with pytest.raises(tf.errors.InvalidArgumentError):
                tf.transpose(tf.constant(x), [0, 0])
            with pytest.raises(tf.errors.InvalidArgumentError):
                tf.split(tf.constant(x), 2, 1)
            with pytest.raises(tf.errors.InvalidArgumentError):
                tf.broadcast_to(tf.constant(x), [3, 3])


# ---- gradients ----

GRAD_CASES = [
    ("transpose", lambda tf, x: [tf.transpose(x, (2, 0, 1))], (2, 3, 5), 0),
    ("concat", lambda tf, x: [tf.concat([x, x[:, :1] * 2.0, x], 1)], (3, 5, 2), 0),
    ("stack", lambda tf, x: [tf.stack([x, x * 3.0], -1)], (3, 5, 2), 0),
    ("unstack", lambda tf, x: tf.unstack(x, axis=1), (3, 5, 2), 0),
    ("split", lambda tf, x: tf.split(x, 5, 1), (3, 5, 2), 0),
    ("split_sizes", lambda tf, x: tf.split(x, [2, -1], 1), (3, 5, 2), 0),
    ("tile", lambda tf, x: [tf.tile(x, (2, 1, 3))], (3, 5, 2), 1e-6),
    ("broadcast_to", lambda tf, x: [tf.broadcast_to(x, (4, 3, 5, 2))], (3, 5, 2), 1e-6),
    ("reverse", lambda tf, x: [tf.reverse(x, [0, 2])], (3, 5, 2), 0),
]


def grad_on(tf, device, fn, x, ws):
    with tf.device(device):
        xt = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            outs = fn(tf, xt)
            loss = tf.add_n([tf.reduce_sum(o * tf.constant(w)) for o, w in zip(outs, ws)])
        return tape.gradient(loss, xt)


@pytest.mark.parametrize("name,fn,shape,rtol", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradients(tf, name, fn, shape, rtol):
    x = rng.standard_normal(shape).astype(np.float32)
    with tf.device("/CPU:0"):
        shapes = [o.shape for o in fn(tf, tf.constant(x))]
    ws = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    g = grad_on(tf, "/GPU:0", fn, x, ws)
    c = grad_on(tf, "/CPU:0", fn, x, ws)
    assert on_gpu(g), g.device
    # Layout gradients move values (exact); Tile and BroadcastTo sum the replicas.
    np.testing.assert_allclose(g.numpy(), c.numpy(), rtol=rtol, atol=rtol)
