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

Reductions of elementwise results (`_TfwgpuFusedReduce`, off with TFWGPU_FUSION_REDUCE=0): a
float32 Sum/Mean/Max/Min/Prod whose input only a group of elementwise ops uses computes that
group's program as it loads its input (Keras's batch-norm variance Mean(SquaredDifference(x,
mean)) and the sums of its gradient); the kernel folds the same values in the same order as
the elementwise kernel and the reduction would: equal bits with it on and off.
"""
import os

import numpy as np
import pytest

from conftest import on_gpu

FUSED = "_TfwgpuFusedElementwise"
MULTI = "_TfwgpuFusedElementwiseMulti"
REDUCE = "_TfwgpuFusedReduce"
REDUCE_MULTI = "_TfwgpuFusedReduceMulti"


def _stats():
    import tensorflow_wgpu

    return tensorflow_wgpu.stats()["gpu_ops"]


def _delta(before, after):
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


class _Fusion:
    """Sets TFWGPU_FUSION (and TFWGPU_FUSION_MULTI: multi-output groups, TFWGPU_FUSION_REDUCE:
    reductions of programs) for the graphs optimized inside the block."""

    def __init__(self, on, multi=True, reduce=True):
        self.on = on
        self.multi = multi
        self.reduce = reduce

    def __enter__(self):
        keys = ("TFWGPU_FUSION", "TFWGPU_FUSION_MULTI", "TFWGPU_FUSION_REDUCE")
        self.old = {k: os.environ.get(k) for k in keys}
        os.environ["TFWGPU_FUSION"] = "1" if self.on else "0"
        os.environ["TFWGPU_FUSION_MULTI"] = "1" if self.multi else "0"
        os.environ["TFWGPU_FUSION_REDUCE"] = "1" if self.reduce else "0"

    def __exit__(self, *exc):
        for k, v in self.old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def _twice_on_gpu(tf, f, *args, multi=True, reduce=True):
    """Runs tf.function(f) on GPU:0 with fusion on: traced and optimized by a first call, then
    the timed second call; its outputs and the kernels it ran (by op)."""
    with _Fusion(True, multi, reduce), tf.device("/GPU:0"):
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


def test_batch_norm_moments_compute_the_variance_as_it_is_reduced(tf):
    """tf.nn.moments (Keras's batch norm in training): variance = Mean(SquaredDifference(x,
    mean)) over N, H, W is one fused reduction reading x and the per-channel mean (no
    full-size squared differences written); equal bits with TFWGPU_FUSION_REDUCE=0 (the
    elementwise kernel, then the Mean: the same values folded in the same order)."""

    def f(x):
        return tf.nn.moments(x, axes=[0, 1, 2], keepdims=True)

    rng = np.random.default_rng(7)
    for shape in [(4, 5, 6, 8), (2, 9, 7, 3), (3, 16, 16, 12)]:
        x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
        (mean, var), d = _twice_on_gpu(tf, f, x)
        assert on_gpu(mean) and on_gpu(var)
        assert d.get(REDUCE) == 1 and "SquaredDifference" not in d, d
        # The mean is a plain Mean of x (its input is no elementwise result).
        assert d.get("Mean") == 1, d
        (mean0, var0), d0 = _twice_on_gpu(tf, f, x, reduce=False)
        assert REDUCE not in d0 and d0.get("SquaredDifference") == 1 and d0.get("Mean") == 2, d0
        np.testing.assert_array_equal(var.numpy(), var0.numpy())
        np.testing.assert_array_equal(mean.numpy(), mean0.numpy())
        with tf.device("/CPU:0"):
            want = [t.numpy() for t in tf.function(f)(tf.constant(x))]
        # Means of n squares in another order than the CPU's: a relative error of
        # ~log2(n) ulp (pairwise sums), the squared differences exact.
        np.testing.assert_allclose(mean.numpy(), want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(var.numpy(), want[1], rtol=1e-5, atol=0)


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"])
@pytest.mark.parametrize("axis,keepdims", [([0], False), ([1, 2], True), (None, False), ([-1], True)])
def test_reductions_of_elementwise_chains_match_cpu(tf, op, axis, keepdims):
    red = getattr(tf.math, op)

    def f(x, y, z):
        return red(tf.nn.relu(x * y + z) - 0.25, axis=axis, keepdims=keepdims)

    rng = np.random.default_rng(8)
    x = rng.uniform(0.5, 1.5, (5, 7, 12)).astype(np.float32)
    y = rng.uniform(0.5, 1.5, (12,)).astype(np.float32)
    z = rng.uniform(-0.2, 0.3, (5, 1, 12)).astype(np.float32)
    got, d = _twice_on_gpu(tf, f, x, y, z)
    assert on_gpu(got)
    assert d == {REDUCE: 1}, d
    off, d_off = _twice_on_gpu(tf, f, x, y, z, reduce=False)
    assert REDUCE not in d_off and d_off.get(FUSED) == 1, d_off
    np.testing.assert_array_equal(got.numpy(), off.numpy())
    with tf.device("/CPU:0"):
        want = tf.function(f)(x, y, z).numpy()
    # The program's ops are exact; sums and products in another order: a few ulp of the
    # terms (sums of up to 420 values of either sign: absolute, on the sum of |terms|).
    if op in ("reduce_max", "reduce_min"):
        np.testing.assert_array_equal(got.numpy(), want)
    elif op == "reduce_prod":
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-30)
    else:
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=2e-5)


def test_values_used_elsewhere_are_more_outputs_of_the_reduction(tf):
    """A value of the reduced program that is also used (or fetched) elsewhere: another output
    of the reduction's kernel (written as the reduction computes it), the same bits as the
    elementwise kernel's."""

    def f(x, y):
        a = x * y
        return tf.reduce_sum(tf.exp(a), axis=0), a + 1.0, a

    rng = np.random.default_rng(9)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    y = rng.standard_normal((5,)).astype(np.float32)
    (s, a1, a), d = _twice_on_gpu(tf, f, x, y)
    # a is an output of one of its consumers' kernels (a + 1's or the reduction's): two
    # kernels in all.
    assert sum(d.values()) == 2 and (d.get(REDUCE) == 1 or d.get(REDUCE_MULTI) == 1), d

    def g(x, y, b):
        # A BiasAdd feeding batch norm's statistics and the normalization: the mean's kernel
        # computes it.
        h = tf.nn.bias_add(x * y, b)
        mean, var = tf.nn.moments(h, axes=[0], keepdims=True)
        return (h - mean) * tf.math.rsqrt(var + 1e-3)

    b = rng.standard_normal((5,)).astype(np.float32)
    got, d = _twice_on_gpu(tf, g, x, y, b)
    assert d.get(REDUCE_MULTI) == 1 and "BiasAdd" not in d and "SquaredDifference" not in d, d
    off, d_off = _twice_on_gpu(tf, g, x, y, b, reduce=False)
    assert REDUCE_MULTI not in d_off, d_off
    np.testing.assert_array_equal(got.numpy(), off.numpy())
    with tf.device("/CPU:0"):
        want = tf.function(g)(x, y, b).numpy()
    # rsqrt on the GPU within a few ulp, the statistics in another order: relative to the
    # normalized values' scale (~1).
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    with tf.device("/CPU:0"):
        want = [t.numpy() for t in tf.function(f)(x, y)]
    np.testing.assert_array_equal(a.numpy(), want[2])
    np.testing.assert_array_equal(a1.numpy(), want[1])
    np.testing.assert_allclose(s.numpy(), want[0], rtol=1e-5, atol=1e-6)


def test_a_reduced_value_used_elsewhere_is_written_by_the_reduction(tf):
    def f(x, y):
        a = x * y
        return tf.reduce_sum(a, axis=0), a

    rng = np.random.default_rng(9)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    y = rng.standard_normal((5,)).astype(np.float32)
    (s, a), d = _twice_on_gpu(tf, f, x, y)
    # The reduction's kernel computes a, writes it (output 1) and sums it.
    assert d == {REDUCE_MULTI: 1}, d
    off, d_off = _twice_on_gpu(tf, f, x, y, reduce=False)
    assert d_off == {"Mul": 1, "Sum": 1}, d_off
    np.testing.assert_array_equal(s.numpy(), off[0].numpy())
    np.testing.assert_array_equal(a.numpy(), off[1].numpy())
    with tf.device("/CPU:0"):
        want = [t.numpy() for t in tf.function(f)(x, y)]
    np.testing.assert_array_equal(a.numpy(), want[1])
    np.testing.assert_allclose(s.numpy(), want[0], rtol=1e-5, atol=1e-6)


def _fit_bn(tf, fused=True, reduce=True, steps=4):
    """A small convolutional model with Keras BatchNormalization layers (tf.nn.moments in
    training, their gradients), SGD with momentum."""
    import keras

    with _Fusion(fused, True, reduce):
        keras.utils.set_random_seed(5)
        rng = np.random.default_rng(6)
        x = rng.standard_normal((32, 8, 8, 3)).astype(np.float32)
        y = rng.integers(0, 4, (32,)).astype(np.int32)
        with tf.device("/GPU:0"):
            model = keras.Sequential(
                [
                    keras.Input((8, 8, 3)),
                    keras.layers.Conv2D(8, 3, padding="same"),
                    keras.layers.BatchNormalization(),
                    keras.layers.ReLU(),
                    keras.layers.Conv2D(12, 3, padding="same", use_bias=False),
                    keras.layers.BatchNormalization(),
                    keras.layers.ReLU(),
                    keras.layers.GlobalAveragePooling2D(),
                    keras.layers.Dense(4),
                ]
            )
            model.compile(
                optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
            before = _stats()
            hist = model.fit(x, y, batch_size=8, epochs=1, steps_per_epoch=steps, shuffle=False, verbose=0)
            d = _delta(before, _stats())
    weights = [w.numpy() for w in model.weights]
    return np.array(hist.history["loss"]), weights, d


def test_keras_fit_with_batch_norm_reduces_programs_with_equal_losses(tf):
    """Keras fit of a model with BN layers: the variances and the gradient's sums run as
    fused reductions; with TFWGPU_FUSION_REDUCE=0 the same values are written by elementwise
    kernels and reduced by the reduce kernels in the same order: equal losses and weights,
    bit for bit. Against no fusion at all: grappler's rewrites of the unfused graph (module
    docstring), rtol 1e-5 on the losses."""
    loss_on, w_on, d_on = _fit_bn(tf)
    loss_red0, w_red0, d_red0 = _fit_bn(tf, reduce=False)
    loss_off, w_off, d_off = _fit_bn(tf, fused=False)
    # 2 BN layers: the variance in the forward, Sum(dy * x_hat) in the gradient, per step
    # (the second's with its ReluGrad as one more output); the first conv's BiasAdd is
    # computed by its mean's kernel.
    assert d_on.get(REDUCE, 0) + d_on.get(REDUCE_MULTI, 0) >= 5 * 4, d_on
    assert d_on.get(REDUCE_MULTI, 0) >= 2 * 4 and "ReluGrad" not in d_on, d_on
    # (the Dense layer's BiasAdd stays a kernel of its own, or of its product's call: no
    # reduction reads it)
    def bias_calls(d):
        return sum(d.get(k, 0) for k in ("BiasAdd", "_TfwgpuConv2DBiasAdd", "_TfwgpuMatMulBiasAdd"))

    assert bias_calls(d_on) == bias_calls(d_red0) - 4, (d_on, d_red0)
    for d in (d_red0, d_off):
        assert REDUCE not in d and REDUCE_MULTI not in d, d
    assert "SquaredDifference" not in d_on and d_red0.get("SquaredDifference", 0) >= 8, (d_on, d_red0)
    assert sum(d_on.values()) < sum(d_red0.values()), (d_on, d_red0)
    np.testing.assert_array_equal(loss_on, loss_red0)
    for a, b in zip(w_on, w_red0):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(loss_on, loss_off, rtol=1e-5)
    assert np.all(np.isfinite(loss_on))


def test_while_loop_bodies_fuse(tf):
    """A lowered while loop's body (a Keras RNN cell, any tf.while_loop) is fused like any
    other subgraph: the pass orders the body's nodes without the loop's back edges
    (NextIteration -> Merge). Before, every node downstream of the loop's Merge got no order
    and ran unfused; a GRU step ran 1,336 kernels, now 816. Results are the unfused ones."""

    def f(x, w):
        def body(i, v):
            return i + 1, tf.tanh(v * 1.5 + 0.25) * tf.sigmoid(v) - v * w

        return tf.while_loop(lambda i, v: i < 6, body, (tf.constant(0), x))[1]

    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, 129)).astype(np.float32)
    w = np.float32(0.5)
    got, d = _twice_on_gpu(tf, f, x, w)
    # Six iterations, each one fused kernel (with or without outputs of its own).
    fused = d.get(FUSED, 0) + d.get(MULTI, 0)
    assert fused >= 6 and "Tanh" not in d and "Sigmoid" not in d and "Mul" not in d, d
    with _Fusion(False), tf.device("/GPU:0"):
        want = tf.function(f)(tf.constant(x), tf.constant(w))
    np.testing.assert_array_equal(got.numpy(), want.numpy())
