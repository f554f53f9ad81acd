"""Gradients through tf.GradientTape on GPU:0 against CPU:0 for the elementwise, reduction,
matmul and nn ops (the families with their own test files cover their gradients there).

Each case computes sum(f(x...) * w) for a fixed random w, so every output element contributes
with its own weight, and compares the gradients with respect to every input. Tolerances come
from the op's numerics: the backward ops are a few float32 roundings deep (elementwise,
1e-5 relative), or sums over up to K=40 products (matmul, reductions: 1e-5 relative, plus an
absolute term for results that cancel to near zero).
"""
import numpy as np
import pytest

import tensorflow_wgpu

rng = np.random.default_rng(7)


def r(*shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


def pos(*shape):
    return rng.uniform(0.2, 2.0, shape).astype(np.float32)


# (name, function of tensors, inputs)
CASES = [
    ("add_broadcast", lambda tf, a, b: a + b, (r(3, 4), r(4))),
    ("sub_broadcast", lambda tf, a, b: a - b, (r(3, 1), r(1, 5))),
    ("mul", lambda tf, a, b: a * b, (r(3, 4), r(3, 4))),
    ("div", lambda tf, a, b: a / b, (r(3, 4), pos(3, 4))),
    ("maximum", lambda tf, a, b: tf.maximum(a, b), (r(5, 6), r(5, 6))),
    ("minimum", lambda tf, a, b: tf.minimum(a, b), (r(5, 6), r(6))),
    ("squared_difference", lambda tf, a, b: tf.math.squared_difference(a, b), (r(4, 3), r(3))),
    ("pow", lambda tf, a, b: tf.pow(a, b), (pos(3, 4), r(3, 4))),
    ("exp", lambda tf, a: tf.exp(a), (r(7, 5),)),
    ("log", lambda tf, a: tf.math.log(a), (pos(7, 5),)),
    ("log1p", lambda tf, a: tf.math.log1p(a), (pos(7, 5),)),
    ("sqrt", lambda tf, a: tf.sqrt(a), (pos(7, 5),)),
    ("rsqrt", lambda tf, a: tf.math.rsqrt(a), (pos(7, 5),)),
    ("reciprocal", lambda tf, a: tf.math.reciprocal(a), (pos(7, 5),)),
    ("square", lambda tf, a: tf.square(a), (r(7, 5),)),
    ("abs_neg", lambda tf, a: tf.abs(-a), (r(7, 5),)),
    ("tanh", lambda tf, a: tf.tanh(a), (r(7, 5),)),
    ("sigmoid", lambda tf, a: tf.sigmoid(a), (r(7, 5),)),
    ("relu", lambda tf, a: tf.nn.relu(a), (r(7, 5),)),
    ("softplus", lambda tf, a: tf.nn.softplus(a), (r(7, 5),)),
    ("select", lambda tf, a, b: tf.where(a > b, a, b * 2.0), (r(4, 5), r(4, 5))),
    ("sum_axis", lambda tf, a: tf.reduce_sum(a, axis=1), (r(6, 7),)),
    ("mean_keepdims", lambda tf, a: tf.reduce_mean(a, axis=0, keepdims=True), (r(6, 7),)),
    ("max_axis", lambda tf, a: tf.reduce_max(a, axis=-1), (r(6, 7),)),
    ("prod_axis", lambda tf, a: tf.reduce_prod(a, axis=1), (pos(4, 5),)),
    ("matmul", lambda tf, a, b: tf.matmul(a, b), (r(5, 40), r(40, 3))),
    ("matmul_transposed", lambda tf, a, b: tf.matmul(a, b, transpose_a=True, transpose_b=True), (r(40, 5), r(3, 40))),
    ("batch_matmul", lambda tf, a, b: tf.matmul(a, b), (r(2, 4, 6), r(2, 6, 3))),
    ("bias_add", lambda tf, a, b: tf.nn.bias_add(a, b), (r(4, 3, 5), r(5))),
    ("softmax", lambda tf, a: tf.nn.softmax(a), (r(4, 9),)),
    ("log_softmax", lambda tf, a: tf.nn.log_softmax(a), (r(4, 9),)),
    ("softmax_xent", lambda tf, a, b: tf.nn.softmax_cross_entropy_with_logits(tf.nn.softmax(b), a), (r(4, 9), r(4, 9))),
    ("l2_loss", lambda tf, a: tf.nn.l2_loss(a) * tf.ones([3]), (r(6, 5),)),
    ("add_n", lambda tf, a, b: tf.add_n([a, b, a]), (r(3, 4), r(3, 4))),
]


def grads(tf, fn, arrays, device):
    with tf.device(device):
        xs = [tf.constant(a) for a in arrays]
        with tf.GradientTape() as tape:
            for x in xs:
                tape.watch(x)
            y = fn(tf, *xs)
            w = tf.constant(np.random.default_rng(1).uniform(0.5, 1.5, y.shape).astype(np.float32))
            loss = tf.reduce_sum(y * w)
        gs = tape.gradient(loss, xs)
    return [g.numpy() for g in gs], [g.device for g in gs]


@pytest.mark.parametrize("name,fn,inputs", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_cpu(tf, name, fn, inputs):
    before = tensorflow_wgpu.stats()["gpu_ops"]
    g, devices = grads(tf, fn, inputs, "/GPU:0")
    after = tensorflow_wgpu.stats()["gpu_ops"]
    c, _ = grads(tf, fn, inputs, "/CPU:0")
    assert all(d.endswith("GPU:0") for d in devices), (name, devices)
    assert sum(after.values()) > sum(before.values())
    for k, (gg, cc) in enumerate(zip(g, c)):
        np.testing.assert_allclose(gg, cc, rtol=1e-5, atol=1e-6, err_msg=f"{name}: d/dx{k}")
