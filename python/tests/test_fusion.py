"""Elementwise fusion (the plugin's graph pass, crates/plugin/src/graph/fusion.rs): chains of
elementwise ops on GPU:0 inside tf.function run as one `_TfwgpuFusedElementwise` kernel, with
TensorFlow's results; `TFWGPU_FUSION=0` (read each time a graph is optimized) turns it off.

Tolerances: against the CPU, additions, subtractions, multiplications, BiasAdd, Relu and
Maximum are exact; division and square root on the GPU are within a few ulp (WGSL allows
2.5 ulp for division), the transcendental functions within a few ulp (the elementwise
family's own code): rtol 1e-6 / 2e-6 where they occur. Fused against unfused (Keras fit): the fused kernel computes every op
as the unfused kernels do, rounding after each (no FMA contraction across ops), so equal
graphs give equal bits; but grappler's arithmetic optimizer runs on the unfused graph after
the plugin's pass (e.g. x / sqrt(y) -> x * rsqrt(y)) and not inside a fused node, so the two
runs may differ by an ulp per step in the updates: rtol 1e-5 on losses after a few steps.

Multi-output groups (`_TfwgpuFusedElementwiseMulti`, off with TFWGPU_FUSION_MULTI=0): values a
group computes that are also used outside it are more outputs of its kernel, and a variable's
read right after an assignment gives the assigned value (SGD's m', Adam's m and v). With them on
and off the same kernels' arithmetic runs on the same values: equal bits.
"""
import os

import numpy as np
import pytest

from conftest import on_gpu

FUSED = "_TfwgpuFusedElementwise"
MULTI = "_TfwgpuFusedElementwiseMulti"


def _stats():
    import tensorflow_wgpu

    return tensorflow_wgpu.stats()["gpu_ops"]


def _delta(before, after):
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


class _Fusion:
    """Sets TFWGPU_FUSION (and TFWGPU_FUSION_MULTI: multi-output groups) for the graphs
    optimized inside the block."""

    def __init__(self, on, multi=True):
        self.on = on
        self.multi = multi

    def __enter__(self):
        self.old = {k: os.environ.get(k) for k in ("TFWGPU_FUSION", "TFWGPU_FUSION_MULTI")}
        os.environ["TFWGPU_FUSION"] = "1" if self.on else "0"
        os.environ["TFWGPU_FUSION_MULTI"] = "1" if self.multi else "0"

    def __exit__(self, *exc):
        for k, v in self.old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def _twice_on_gpu(tf, f, *args, multi=True):
    """Runs tf.function(f) on GPU:0 with fusion on: traced and optimized by a first call, then
    the timed second call; its outputs and the kernels it ran (by op)."""
    with _Fusion(True, multi), tf.device("/GPU:0"):
        g = tf.function(f)
        g(*[tf.constant(a) for a in args])
        before = _stats()
        got = g(*[tf.constant(a) for a in args])
        return got, _delta(before, _stats())


def _chain(tf):
    def f(x, b, m, v, g, lr):
        h = tf.nn.relu(tf.nn.bias_add(x, b))
        m1 = m + (g - m) * 0.1
        v1 = v + (tf.square(g) - v) * 0.001
        upd = x - (m1 * lr) / (tf.sqrt(v1) + 1e-7)
        return tf.maximum(h, upd), m1, tf.exp(tf.tanh(v1) * -2.0)

    return f


def _inputs(tf, shape=(7, 129)):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(shape[-1:]).astype(np.float32)
    m = (0.1 * rng.standard_normal(shape)).astype(np.float32)
    v = rng.uniform(0, 0.01, shape).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    return [x, b, m, v, g, np.float32(0.01)]


@pytest.mark.parametrize("multi", [True, False])
@pytest.mark.parametrize("shape", [(7, 129), (1, 3), (2, 5, 33)])
def test_chain_matches_cpu_and_runs_fused(tf, shape, multi):
    args = _inputs(tf, shape)
    with tf.device("/CPU:0"):
        want = [t.numpy() for t in tf.function(_chain(tf))(*[tf.constant(a) for a in args])]
    with _Fusion(True, multi), tf.device("/GPU:0"):
        ins = [tf.constant(a) for a in args]
        f = tf.function(_chain(tf))
        f(*ins)  # traced and optimized
        before = _stats()
        got = f(*ins)
        d = _delta(before, _stats())
    assert all(on_gpu(t) for t in got)
    if multi:
        # m1 (returned and used by upd) and v1 (used by sqrt and tanh) are outputs of the
        # groups that use them: two kernels in all.
        assert d == {MULTI: 2}, d
    else:
        # Four groups: m1, v1, max(h, upd) and exp(tanh(v1) * -2); no elementwise op left to
        # run alone.
        assert d.get(FUSED) == 4 and MULTI not in d, d
    for op in ("AddV2", "Sub", "Mul", "RealDiv", "Sqrt", "Square", "Relu", "BiasAdd", "Maximum", "Exp", "Tanh"):
        assert op not in d, (op, d)
    np.testing.assert_allclose(got[1].numpy(), want[1], rtol=0, atol=0)
    np.testing.assert_allclose(got[0].numpy(), want[0], rtol=2e-6, atol=0)
    np.testing.assert_allclose(got[2].numpy(), want[2], rtol=1e-6, atol=0)


def test_fusion_off_runs_each_op(tf):
    args = _inputs(tf)
    with _Fusion(False), tf.device("/GPU:0"):
        ins = [tf.constant(a) for a in args]
        f = tf.function(_chain(tf))
        f(*ins)
        before = _stats()
        off = f(*ins)
        d = _delta(before, _stats())
    assert FUSED not in d and MULTI not in d, d
    assert d.get("Mul", 0) >= 3 and d.get("Sqrt") == 1, d
    with _Fusion(True), tf.device("/GPU:0"):
        on = tf.function(_chain(tf))(*ins)
    # Equal graphs but for grappler's rewrites of the unfused ops (module docstring).
    for a, b in zip(on, off):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-6, atol=0)


@pytest.mark.parametrize("multi", [True, False])
def test_fetched_and_shared_intermediates(tf, multi):
    """An intermediate result that is also used outside its consumer's group is an output of
    that group (multi-output groups) or stays a node of its own (without them)."""

    def f(x, y):
        a = x * y
        b = tf.exp(a)
        return b + a, tf.sqrt(b) - 1.0

    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (5, 9)).astype(np.float32)
    y = rng.uniform(-1, 1, (9,)).astype(np.float32)
    with tf.device("/CPU:0"):
        want = [t.numpy() for t in tf.function(f)(x, y)]
    got, d = _twice_on_gpu(tf, f, x, y, multi=multi)
    if multi:
        # a and b are outputs 1 and 2 of sqrt(b) - 1's group; b + a adds them.
        assert d == {MULTI: 1, "AddV2": 1}, d
    else:
        # a (Mul) and b (Exp) each have two consumers: 4 kernels, (Sqrt, Sub) fused.
        assert d.get("Mul") == 1 and d.get("Exp") == 1 and d.get(FUSED) == 1, d
    # exp and sqrt are a few ulp off the CPU's; sqrt(b) - 1 and b + a cancel near 0: an
    # absolute error of a few ulp of 1.
    for gt, w in zip(got, want):
        np.testing.assert_allclose(gt.numpy(), w, rtol=1e-6, atol=4e-7)


def test_outputs_of_other_shapes(tf):
    """Batch norm's scale and shift ([C]) are used by the gradient too: outputs of the
    group that normalizes x ([N, C]), written by a dispatch of their own shape; exact (the
    same ops as the unfused kernels: products, sums, rsqrt on the GPU in both)."""

    def f(x, mean, var, gamma, beta):
        r = tf.math.rsqrt(var + 1e-3)
        scale = r * gamma
        shift = beta - mean * scale
        y = tf.nn.relu(x * scale + shift)
        return y, tf.stack([scale, r])

    rng = np.random.default_rng(11)
    c = 37
    x = rng.standard_normal((13, c)).astype(np.float32)
    mean = rng.standard_normal(c).astype(np.float32)
    var = rng.uniform(0.1, 2, c).astype(np.float32)
    gamma = rng.standard_normal(c).astype(np.float32)
    beta = rng.standard_normal(c).astype(np.float32)
    args = (x, mean, var, gamma, beta)
    got, d = _twice_on_gpu(tf, f, *args)
    unfused, d_off = _twice_on_gpu(tf, f, *args, multi=False)
    assert d.get(MULTI) == 1 and "Mul" not in d and "Rsqrt" not in d, d
    assert MULTI not in d_off, d_off
    for a, b in zip(got, unfused):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with tf.device("/CPU:0"):
        want = [t.numpy() for t in tf.function(f)(*args)]
    # rsqrt on the GPU: a few ulp.
    for gt, w in zip(got, want):
        np.testing.assert_allclose(gt.numpy(), w, rtol=2e-6, atol=1e-6)


def _fit(tf, fused, steps=6, optimizer=None, multi=True):
    import keras

    with _Fusion(fused, multi):
        keras.utils.set_random_seed(3)
        rng = np.random.default_rng(4)
        x = rng.standard_normal((96, 12)).astype(np.float32)
        y = rng.integers(0, 4, (96,)).astype(np.int32)
        with tf.device("/GPU:0"):
            model = keras.Sequential(
                [
                    keras.Input((12,)),
                    keras.layers.Dense(16, activation="relu"),
                    keras.layers.Dense(16, activation="tanh"),
                    keras.layers.Dense(4),
                ]
            )
            model.compile(
                optimizer=optimizer() if optimizer else keras.optimizers.Adam(0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
            before = _stats()
            hist = model.fit(x, y, batch_size=16, epochs=steps // 6 + 1, shuffle=False, verbose=0)
            d = _delta(before, _stats())
    # The optimizer's state too (momenta, moments, the iteration count).
    weights = [w.numpy() for w in model.weights] + [v.numpy() for v in model.optimizer.variables]
    return np.array(hist.history["loss"]), weights, d


def test_keras_fit_with_adam_matches_unfused(tf):
    loss_on, w_on, d_on = _fit(tf, True)
    loss_off, w_off, d_off = _fit(tf, False)
    assert d_on.get(FUSED, 0) > 0 and FUSED not in d_off and MULTI not in d_off, (d_on, d_off)
    # Adam's m' and v' are assigned and used by the variable's update: outputs of its kernel.
    assert d_on.get(MULTI, 0) > 0, d_on
    calls_on, calls_off = sum(d_on.values()), sum(d_off.values())
    # Adam's update and Dense's bias + activation: far fewer kernel calls.
    assert calls_on < 0.7 * calls_off, (calls_on, calls_off)
    np.testing.assert_allclose(loss_on, loss_off, rtol=1e-5)
    for a, b in zip(w_on, w_off):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_keras_fit_with_sgd_momentum_fuses_each_update_into_one_kernel(tf):
    """Keras SGD with momentum: m' = m * momentum - g * lr is assigned to m and added to the
    variable: one multi-output kernel per variable and step. Multi-output groups on and off
    run the same kernels' arithmetic on the same graph: equal bits. Against no fusion at all:
    rtol 1e-5 on losses (grappler's rewrites of unfused graphs, module docstring)."""
    import keras

    def sgd():
        return keras.optimizers.SGD(0.05, momentum=0.9)

    loss_multi, w_multi, d_multi = _fit(tf, True, optimizer=sgd)
    loss_single, w_single, d_single = _fit(tf, True, optimizer=sgd, multi=False)
    loss_off, w_off, d_off = _fit(tf, False, optimizer=sgd)
    # 6 variables, 6 steps (and the warm-up's): at least one kernel per variable and step.
    assert d_multi.get(MULTI, 0) >= 36 and MULTI not in d_single and MULTI not in d_off
    calls = [sum(d.values()) for d in (d_multi, d_single, d_off)]
    # Each variable's update: one kernel instead of two.
    assert calls[0] <= calls[1] - 36, calls
    np.testing.assert_array_equal(loss_multi, loss_single)
    for a, b in zip(w_multi, w_single):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(loss_multi, loss_off, rtol=1e-5)
    for a, b in zip(w_multi, w_off):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


FUSED_TILED = "_TfwgpuFusedElementwiseTiled"


def _bn_grads(tf, x, w):
    """Keras's batch normalization in training (tf.nn.moments over N, H, W, then
    tf.nn.batch_normalization), a ReLU, and the gradients of a weighted sum of the result."""
    import keras

    bn = keras.layers.BatchNormalization()
    bn.build(x.shape)

    @tf.function
    def f(x, w):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.nn.relu(bn(x, training=True))
            loss = tf.reduce_sum(y * w)
        return tape.gradient(loss, [x, bn.gamma, bn.beta])

    return f


def test_batch_norm_gradient_fuses_the_tiles_of_its_mean_gradients(tf):
    """The gradient of a mean over N, H, W tiles a [1,1,1,C] tensor to the input's shape; the
    pass fuses those Tiles as broadcasts (with AddN and ReluGrad) into the elementwise
    consumers, so no full-size tiled tensor is written."""
    rng = np.random.default_rng(5)
    shape = (4, 5, 6, 8)
    x = rng.standard_normal(shape).astype(np.float32) * 2 + 0.5
    w = rng.standard_normal(shape).astype(np.float32)
    with tf.device("/CPU:0"):
        want = [t.numpy() for t in _bn_grads(tf, tf.constant(x), tf.constant(w))(tf.constant(x), tf.constant(w))]
    with _Fusion(True), tf.device("/GPU:0"):
        xs, ws = tf.constant(x), tf.constant(w)
        f = _bn_grads(tf, xs, ws)
        f(xs, ws)
        before = _stats()
        got = f(xs, ws)
        d = _delta(before, _stats())
    assert all(on_gpu(t) for t in got)
    assert d.get(FUSED_TILED, 0) >= 1 and "Tile" not in d, d
    assert "AddN" not in d and "ReluGrad" not in d, d
    # The statistics' gradients (RsqrtGrad and the products around it) and the values both
    # passes use are outputs of multi-output kernels.
    assert "RsqrtGrad" not in d and "Neg" not in d and d.get(MULTI, 0) >= 2, d
    # Each gradient sums 120 products per channel (means, variances, the sums of dy and
    # dy * x_hat) in another order than the CPU: a relative error of about sqrt(120) ulp of
    # the sums' terms; dx subtracts those means from dy * gamma / sigma, so its error is
    # relative to the terms' size (|dy| ~ 1), not to dx's.
    for g, wnt, name in zip(got, want, ("dx", "dgamma", "dbeta")):
        scale = np.abs(wnt).max()
        np.testing.assert_allclose(g.numpy(), wnt, rtol=1e-5, atol=2e-6 * scale, err_msg=name)


def test_tile_of_data_in_a_fused_group_matches_cpu(tf):
    """tf.tile of a real tensor (no broadcast) with constant multiples, then elementwise ops:
    the fused kernel tiles the input first, then computes the program."""

    def f(x, y):
        return tf.tile(x, [2, 3]) * 0.5 + y

    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    y = rng.standard_normal((6, 12)).astype(np.float32)
    with tf.device("/CPU:0"):
        want = tf.function(f)(x, y).numpy()
    got, d = _twice_on_gpu(tf, f, x, y)
    assert on_gpu(got)
    assert d.get(FUSED_TILED) == 1 and "Tile" not in d, d
    np.testing.assert_array_equal(got.numpy(), want)
