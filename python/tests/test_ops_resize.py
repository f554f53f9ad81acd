"""Image resizes on /GPU:0 against /CPU:0: ResizeBilinear (float32 and float16 images) and
ResizeNearestNeighbor (every registered dtype) with their gradients, every combination of
align_corners and half_pixel_centers, up- and downsampling, TensorFlow's errors, and Keras's
Resizing and bilinear UpSampling2D training on the GPU with no fallback."""
import numpy as np
import pytest

from conftest import ran_on_gpu, same_error

SIZES = [(10, 14), (3, 4), (5, 7), (9, 2), (1, 1)]
MODES = [(False, False), (True, False), (False, True)]


def _resize(tf, method, size, ac, hp):
    if method == "bilinear":
        return lambda v: tf.raw_ops.ResizeBilinear(images=v, size=size, align_corners=ac, half_pixel_centers=hp)
    return lambda v: tf.raw_ops.ResizeNearestNeighbor(images=v, size=size, align_corners=ac, half_pixel_centers=hp)


def _with_grad(tf, f):
    def g(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            y = f(v)
            w = tf.reshape(tf.cast(tf.range(tf.size(y)) % 13, y.dtype), tf.shape(y)) - 6.0
            s = tf.reduce_sum(tf.cast(y, tf.float32) * tf.cast(w, tf.float32))
        return y, tape.gradient(s, v)

    return g


@pytest.mark.parametrize("method", ["bilinear", "nearest"])
@pytest.mark.parametrize("size", SIZES, ids=str)
def test_resize_and_gradient_float32(tf, method, size):
    rng = np.random.default_rng(sum(size))
    x = rng.standard_normal((2, 5, 7, 3)).astype(np.float32)
    op = "ResizeBilinear" if method == "bilinear" else "ResizeNearestNeighbor"
    for ac, hp in MODES:
        f = _with_grad(tf, _resize(tf, method, size, ac, hp))
        with ran_on_gpu(op, op + "Grad"):
            with tf.device("/GPU:0"):
                g, gg = f(tf.constant(x))
        with tf.device("/CPU:0"):
            c, cg = f(tf.constant(x))
        assert g.dtype == c.dtype and g.shape == c.shape
        # The same float32 operations in the same order; the GPU may contract a multiply and
        # an add into one fma: a few ulp of the values (|x| < 5, weights below 7 times up to a
        # dozen terms per gradient element).
        np.testing.assert_allclose(g.numpy(), c.numpy(), rtol=0, atol=4e-6)
        np.testing.assert_allclose(gg.numpy(), cg.numpy(), rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "shape,size",
    [((1, 1, 1, 1), (260, 260)), ((2, 1, 1, 3), (300, 200)), ((1, 2, 2, 1), (300, 300)), ((1, 3, 1, 1), (70000, 1))],
    ids=str,
)
def test_resize_gradients_of_large_upsampling(tf, shape, size):
    """Upsampling by large factors: a pixel's gradient sums tens of thousands of resized
    positions, past what one shader loop may run on CPU adapters (lavapipe cut the loop short:
    wrong sums), so these gradients scatter with atomic adds. Nearest neighbour's terms are
    small integers here (exact in any order); bilinear's sums round in another order than the
    CPU's: within K ulp of the sum for K terms per pixel."""
    x = np.random.default_rng(12).standard_normal(shape).astype(np.float32)
    terms = 4 * size[0] * size[1] // (shape[1] * shape[2])
    for method in ["bilinear", "nearest"]:
        op = "ResizeBilinearGrad" if method == "bilinear" else "ResizeNearestNeighborGrad"
        f = _with_grad(tf, _resize(tf, method, size, False, method == "bilinear"))
        with ran_on_gpu(op):
            with tf.device("/GPU:0"):
                _, gg = f(tf.constant(x))
        with tf.device("/CPU:0"):
            _, cg = f(tf.constant(x))
        if method == "nearest":
            np.testing.assert_array_equal(gg.numpy(), cg.numpy())
        else:
            bound = terms * 1.2e-7 * 6 * terms / 4
            np.testing.assert_allclose(gg.numpy(), cg.numpy(), rtol=0, atol=bound)


def test_resize_float16_and_other_dtypes(tf):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 5, 4)).astype(np.float16)
    for ac, hp in MODES:
        f = _with_grad(tf, _resize(tf, "bilinear", (9, 3), ac, hp))
        with ran_on_gpu("ResizeBilinear", "ResizeBilinearGrad"):
            with tf.device("/GPU:0"):
                g, gg = f(tf.constant(x))
        with tf.device("/CPU:0"):
            c, cg = f(tf.constant(x))
        # float32 output from float16 images: the same arithmetic.
        assert g.dtype == tf.float32
        np.testing.assert_allclose(g.numpy(), c.numpy(), rtol=0, atol=4e-6)
        # The gradient is summed in float32 and rounded once to float16 (as TensorFlow's).
        assert gg.dtype == tf.float16
        np.testing.assert_allclose(gg.numpy().astype(np.float32), cg.numpy().astype(np.float32), rtol=2e-3, atol=2e-3)
    for dtype in ["float16", "int32", "int64", "uint8"]:
        v = (rng.standard_normal((1, 4, 5, 3)) * 50).astype(dtype)
        for ac, hp in MODES:
            f = _resize(tf, "nearest", (7, 3), ac, hp)
            with ran_on_gpu("ResizeNearestNeighbor"):
                with tf.device("/GPU:0"):
                    g = f(tf.constant(v))
            with tf.device("/CPU:0"):
                c = f(tf.constant(v))
            np.testing.assert_array_equal(g.numpy(), c.numpy())
    # The float16 nearest-neighbour gradient: float32 sums rounded once (TensorFlow's CPU adds
    # in half, which drifts where many elements add into one pixel; a downsample adds few).
    f = _with_grad(tf, _resize(tf, "nearest", (3, 2), False, True))
    with tf.device("/GPU:0"):
        _, gg = f(tf.constant(x))
    with tf.device("/CPU:0"):
        _, cg = f(tf.constant(x))
    np.testing.assert_allclose(gg.numpy().astype(np.float32), cg.numpy().astype(np.float32), rtol=4e-3, atol=4e-3)


@pytest.mark.parametrize(
    "call",
    [
        lambda tf: tf.raw_ops.ResizeBilinear(images=tf.zeros([2, 3, 4]), size=[2, 2]),
        lambda tf: tf.raw_ops.ResizeBilinear(images=tf.zeros([1, 3, 4, 1]), size=[2, 0]),
        lambda tf: tf.raw_ops.ResizeBilinear(images=tf.zeros([1, 3, 4, 1]), size=[2, 2], align_corners=True, half_pixel_centers=True),
        lambda tf: tf.raw_ops.ResizeNearestNeighbor(images=tf.zeros([1, 0, 4, 1]), size=[2, 2]),
        lambda tf: tf.raw_ops.ResizeBilinear(images=tf.zeros([1, 3, 4, 1]), size=[2, 2, 2]),
    ],
)
def test_resize_errors_are_tensorflows(tf, call):
    same_error(tf, lambda: call(tf))


def test_keras_resizing_layers_train_on_the_gpu(tf):
    """Keras's Resizing (bilinear) and UpSampling2D(interpolation="bilinear") in a model
    trained with `fit`: the resizes and their gradients run on the GPU (they went to the CPU,
    with their inputs and outputs copied each way every step), the step reads back only what
    Keras asks for, and the losses are the CPU's."""
    import keras
    import tensorflow_wgpu

    rng = np.random.default_rng(4)
    x = rng.standard_normal((32, 12, 12, 3)).astype(np.float32)
    y = rng.integers(0, 4, 32).astype(np.int32)
    losses = {}
    for device in ["/CPU:0", "/GPU:0"]:
        with tf.device(device):
            keras.utils.set_random_seed(5)
            m = keras.Sequential([
                keras.Input((12, 12, 3)),
                keras.layers.Resizing(18, 18),
                keras.layers.Conv2D(4, 3),
                keras.layers.UpSampling2D(interpolation="bilinear"),
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
    runs = {k: after["gpu_ops"].get(k, 0) - before["gpu_ops"].get(k, 0) for k in ("ResizeBilinear", "ResizeBilinearGrad")}
    assert runs["ResizeBilinear"] >= 8 and runs["ResizeBilinearGrad"] >= 4, runs
    reads = after["runtime"]["reads"] - before["runtime"]["reads"]
    # Four steps: the loss each step, and once more at the epoch's end.
    assert reads <= 4 + 2, reads
    np.testing.assert_allclose(losses["/GPU:0"], losses["/CPU:0"], rtol=1e-5)


def _rotation(a, h, w):
    import math

    c, s = math.cos(a), math.sin(a)
    cx, cy = (w - 1) / 2, (h - 1) / 2
    return [c, -s, cx - c * cx + s * cy, s, c, cy - s * cx - c * cy, 0, 0]


@pytest.mark.parametrize("interpolation", ["NEAREST", "BILINEAR"])
@pytest.mark.parametrize("fill_mode", ["REFLECT", "WRAP", "CONSTANT", "NEAREST"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_image_projective_transform(tf, interpolation, fill_mode, dtype):
    """Keras's RandomRotation / RandomZoom / RandomTranslation: a rotation, a projective map
    and a zoom with a shift, one transform per image or one for all, every fill mode and both
    interpolations, against TensorFlow's CPU kernel. The coordinates are the same float32
    expressions (the GPU may contract a multiply-add): within a few ulp of the values, which
    only an exact .5 rounding tie could break for NEAREST (none in these transforms)."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 9, 11, 2)).astype(dtype)
    t = np.array(
        [_rotation(0.3, 9, 11), [1.2, 0.1, -2, 0.05, 0.9, 1.5, 0.001, -0.002], [0.8, 0, 3, 0, 1.3, -4, 0, 0]],
        np.float32,
    )
    for ts in (t, t[:1]):
        for shape in [(9, 11), (13, 7)]:
            f = lambda v: tf.raw_ops.ImageProjectiveTransformV3(
                images=v, transforms=tf.constant(ts), output_shape=shape, fill_value=0.5,
                interpolation=interpolation, fill_mode=fill_mode,
            )
            with ran_on_gpu("ImageProjectiveTransformV3"):
                with tf.device("/GPU:0"):
                    g = f(tf.constant(x))
            with tf.device("/CPU:0"):
                c = f(tf.constant(x))
            assert g.dtype == c.dtype and g.shape == c.shape
            tol = dict(rtol=0, atol=2e-5) if dtype == "float32" else dict(rtol=1e-3, atol=2e-3)
            np.testing.assert_allclose(g.numpy().astype(np.float32), c.numpy().astype(np.float32), **tol)


def test_image_projective_transform_errors_are_tensorflows(tf):
    calls = [
        lambda: tf.raw_ops.ImageProjectiveTransformV3(images=tf.zeros([2, 3, 4]), transforms=tf.zeros([1, 8]), output_shape=[2, 2], fill_value=0.0, interpolation="NEAREST"),
        lambda: tf.raw_ops.ImageProjectiveTransformV3(images=tf.zeros([2, 3, 4, 1]), transforms=tf.zeros([3, 8]), output_shape=[2, 2], fill_value=0.0, interpolation="NEAREST"),
        lambda: tf.raw_ops.ImageProjectiveTransformV3(images=tf.zeros([2, 3, 4, 1]), transforms=tf.zeros([1, 8]), output_shape=[2, 0], fill_value=0.0, interpolation="NEAREST"),
    ]
    for call in calls:
        same_error(tf, call)


def test_keras_augmentation_layers_train_on_the_gpu(tf):
    """RandomFlip, RandomRotation, RandomZoom, RandomTranslation and RandomContrast inside a
    model: the projective transforms (and Tan, which the rotation's matrix uses) run on the GPU,
    and the step reads back only the loss (they went to the CPU with the images each step)."""
    import keras
    import tensorflow_wgpu

    rng = np.random.default_rng(10)
    x = rng.standard_normal((32, 16, 16, 3)).astype(np.float32)
    y = rng.integers(0, 4, 32).astype(np.int32)
    with tf.device("/GPU:0"):
        keras.utils.set_random_seed(11)
        m = keras.Sequential([
            keras.Input((16, 16, 3)),
            keras.layers.RandomFlip(),
            keras.layers.RandomRotation(0.1),
            keras.layers.RandomZoom(0.1),
            keras.layers.RandomTranslation(0.1, 0.1),
            keras.layers.RandomContrast(0.2),
            keras.layers.Conv2D(4, 3),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(4),
        ])
        m.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
        m.fit(ds, epochs=1, verbose=0)
        before = tensorflow_wgpu.stats()
        h = m.fit(ds, epochs=1, verbose=0)
        after = tensorflow_wgpu.stats()
    runs = after["gpu_ops"].get("ImageProjectiveTransformV3", 0) - before["gpu_ops"].get("ImageProjectiveTransformV3", 0)
    assert runs >= 3 * 4, runs
    reads = after["runtime"]["reads"] - before["runtime"]["reads"]
    # Four steps: the loss each step, and once more at the epoch's end.
    assert reads <= 4 + 2, reads
    assert np.isfinite(h.history["loss"][0])
