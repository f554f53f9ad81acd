"""The plugin in stock TensorFlow: device listing, placement, results against CPU:0, graphs,
variables, memory figures, errors, threads and a long loop."""
import threading

import numpy as np
import pytest

from conftest import on_gpu


def test_gpu_is_listed_with_its_adapter(tf):
    import tensorflow_wgpu

    gpus = tf.config.list_physical_devices("GPU")
    assert gpus[0].name == "/physical_device:GPU:0"
    opened = [a for a in tensorflow_wgpu.adapters() if a["tensorflow_device"] == "/GPU:0"]
    assert len(opened) == 1 and opened[0]["name"]
    assert tensorflow_wgpu.tensorflow_version() == tf.__version__


def both(tf, fn, *arrays):
    """Runs fn on GPU:0 and CPU:0 with the same inputs; returns (gpu tensor, cpu tensor)."""
    with tf.device("/GPU:0"):
        g = fn(*[tf.constant(a) for a in arrays])
    with tf.device("/CPU:0"):
        c = fn(*[tf.constant(a) for a in arrays])
    return g, c


rng = np.random.default_rng(0)
x23 = rng.standard_normal((2, 3)).astype(np.float32)
x31 = rng.standard_normal((3, 1)).astype(np.float32)
x14 = rng.standard_normal((1, 4)).astype(np.float32)
pos = rng.uniform(0.1, 3.0, (7, 129)).astype(np.float32)
i32 = rng.integers(-100, 100, (5, 7)).astype(np.int32)
m = rng.standard_normal((40, 40)).astype(np.float32)

# (name, function, inputs, rtol): tolerances from each op's numerics (exact for add/sub/mul,
# max/min, integer ops and casts; a few ulp for division and transcendental functions).
CASES = [
    ("add_broadcast", lambda a, b: a + b, (x31, x14), 0),
    ("sub", lambda a, b: a - b, (x23, x23[::-1].copy()), 0),
    ("mul_scalar", lambda a, b: a * b, (x23, np.float32(3.5)), 0),
    ("div", lambda a, b: a / b, (pos, pos[::-1].copy()), 3e-7),
    ("maximum", lambda a, b: tf_mod.maximum(a, b), (x31, x14), 0),
    ("minimum_int", lambda a, b: tf_mod.minimum(a, b), (i32, i32[::-1].copy()), 0),
    ("add_int", lambda a, b: a + b, (i32, i32), 0),
    ("exp", lambda a: tf_mod.exp(a), (x23,), 1e-6),
    ("log", lambda a: tf_mod.math.log(a), (pos,), 1e-6),
    ("sqrt", lambda a: tf_mod.sqrt(a), (pos,), 1e-6),
    ("tanh", lambda a: tf_mod.tanh(a), (x23,), 2e-6),
    ("sigmoid", lambda a: tf_mod.sigmoid(a), (x23,), 2e-6),
    ("relu", lambda a: tf_mod.nn.relu(a), (x23,), 0),
    ("neg_abs", lambda a: tf_mod.abs(-a), (x23,), 0),
    ("cast_f32_i32", lambda a: tf_mod.cast(a * 10.0, tf_mod.int32), (x23,), 0),
    ("cast_i32_f16", lambda a: tf_mod.cast(a, tf_mod.float16), (i32,), 0),
    ("sum_axis1", lambda a: tf_mod.reduce_sum(a, axis=1), (pos,), 1e-6),
    ("sum_all_keepdims", lambda a: tf_mod.reduce_sum(a, keepdims=True), (pos,), 1e-6),
    ("max_axis0", lambda a: tf_mod.reduce_max(a, axis=0), (pos,), 0),
    ("matmul", lambda a, b: tf_mod.matmul(a, b), (m[:7, :33], m[:33, :17]), 1e-5),
    ("matmul_t", lambda a, b: tf_mod.matmul(a, b, transpose_a=True, transpose_b=True), (m[:33, :7], m[:17, :33]), 1e-5),
    ("batch_matmul", lambda a, b: tf_mod.matmul(a, b), (rng.standard_normal((2, 1, 5, 6)).astype(np.float32), rng.standard_normal((3, 6, 4)).astype(np.float32)), 1e-5),
    ("fill", lambda a: tf_mod.fill([3, 5], a), (np.float32(2.5),), 0),
    ("zeros_like", lambda a: tf_mod.zeros_like(a), (x23,), 0),
    ("ones_like", lambda a: tf_mod.ones_like(a), (i32,), 0),
]
tf_mod = None


@pytest.mark.parametrize("name,fn,inputs,rtol", CASES, ids=[c[0] for c in CASES])
def test_op_runs_on_gpu_and_matches_cpu(tf, name, fn, inputs, rtol):
    global tf_mod
    tf_mod = tf
    g, c = both(tf, fn, *inputs)
    assert on_gpu(g), f"{name} ran on {g.device}"
    assert g.dtype == c.dtype and g.shape == c.shape
    if rtol == 0:
        np.testing.assert_array_equal(g.numpy(), c.numpy())
    else:
        np.testing.assert_allclose(g.numpy(), c.numpy(), rtol=rtol, atol=rtol)


def test_graph_mode_tf_function(tf):
    @tf.function
    def layer(x, w, b):
        return tf.nn.relu(tf.matmul(x, w) + b)

    x, w, b = pos[:4, :6], pos[:6, :3] - 1.0, x14[0, :3]
    with tf.device("/GPU:0"):
        g = layer(tf.constant(x), tf.constant(w), tf.constant(b))
    assert on_gpu(g)
    want = np.maximum(x @ w + b, 0)
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-5, atol=1e-6)


def test_variables_live_on_gpu(tf):
    with tf.device("/GPU:0"):
        v = tf.Variable(x23)
    assert on_gpu(v.handle)
    np.testing.assert_array_equal(v.numpy(), x23)
    v.assign(x23 * 2)
    r = v.read_value()
    assert on_gpu(r)
    np.testing.assert_array_equal(r.numpy(), x23 * 2)


def test_eager_variable_updates_run_on_gpu(tf):
    # TensorFlow's own kernels for these compute on the CPU; the package's hook
    # (tensorflow_wgpu/_hooks.py) runs them as read + AddV2/Sub/GatherV2 + assign.
    with tf.device("/GPU:0"):
        v = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
    v.assign_add([[1.0, 1.0], [1.0, 1.0]])
    v.assign_sub([[0.5, 0.5], [0.5, 0.5]])
    np.testing.assert_array_equal(v.numpy(), [[1.5, 2.5], [3.5, 4.5]])
    np.testing.assert_array_equal(tf.gather(v, [1]).numpy(), [[3.5, 4.5]])
    assert on_gpu(v.handle)


def test_unsupported_variable_ops_fail_cleanly_not_with_a_crash(tf):
    # A known gap (crates/plugin/src/variables.rs): an error, and the process goes on.
    with tf.device("/GPU:0"):
        v = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(tf.errors.UnimplementedError, match="ResourceScatterUpdate"):
        v.scatter_update(tf.IndexedSlices(tf.constant([[9.0, 9.0]]), tf.constant([1])))
    np.testing.assert_array_equal(v.numpy(), [[1.0, 2.0], [3.0, 4.0]])


def test_memory_info_follows_tensors(tf):
    info = lambda: tf.config.experimental.get_memory_info("GPU:0")["current"]  # noqa: E731
    before = info()
    with tf.device("/GPU:0"):
        big = tf.zeros([1024, 1024])
    during = info()
    assert during >= before + 4 * 1024 * 1024
    del big
    assert info() <= during - 4 * 1024 * 1024


def test_bad_input_raises_like_cpu_and_process_goes_on(tf):
    with tf.device("/GPU:0"):
        with pytest.raises(tf.errors.InvalidArgumentError, match="incompatible shapes"):
            tf.add(tf.ones([2, 3]), tf.ones([4]))
        with pytest.raises(tf.errors.InvalidArgumentError):
            tf.matmul(tf.ones([2, 3]), tf.ones([4, 5]))
        with pytest.raises(tf.errors.InvalidArgumentError):
            tf.reduce_sum(tf.ones([2, 3]), axis=5)
        ok = tf.add(tf.ones([2]), tf.ones([2]))
    np.testing.assert_array_equal(ok.numpy(), [2.0, 2.0])


def test_sixteen_threads_get_the_results_they_get_alone(tf):
    def work(seed):
        r = np.random.default_rng(seed)
        a = r.standard_normal((16, 24)).astype(np.float32)
        b = r.standard_normal((24, 8)).astype(np.float32)
        with tf.device("/GPU:0"):
            out = tf.reduce_sum(tf.nn.relu(tf.matmul(a, b)) * 2.0 - 1.0, axis=0)
            return out.numpy()

    alone = [work(s) for s in range(16)]
    together = [None] * 16
    errors = []

    def run(s):
        try:
            for _ in range(5):
                together[s] = work(s)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for s in range(16):
        np.testing.assert_array_equal(together[s], alone[s])


def test_ten_thousand_small_ops_leave_memory_flat(tf):
    with tf.device("/GPU:0"):
        x = tf.ones([64])
        x = x + 1.0
        tf.config.experimental.get_memory_info("GPU:0")
        start = tf.config.experimental.get_memory_info("GPU:0")["current"]
        for _ in range(10_000):
            x = x + 1.0
        end = tf.config.experimental.get_memory_info("GPU:0")["current"]
    assert x.numpy()[0] == 10_002.0
    assert end == start


def test_without_an_adapter_tensorflow_runs_on_its_cpu_with_one_warning():
    import subprocess
    import sys

    code = (
        "import tensorflow as tf; "
        "print('GPUS', len(tf.config.list_physical_devices('GPU'))); "
        "print('SUM', float(tf.reduce_sum(tf.ones([3]))))"
    )
    env = dict(__import__("os").environ, TFWGPU_ADAPTER="no-such-adapter", TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "GPUS 0" in r.stdout and "SUM 3.0" in r.stdout
    warnings = [l for l in r.stderr.splitlines() if l.startswith("tfwgpu:")]
    assert len(warnings) == 1 and "no-such-adapter" in warnings[0], r.stderr[-2000:]


def test_int32_shape_arithmetic_stays_in_host_memory(tf):
    """Where TensorFlow keeps an op's int32 tensors in host memory on every device (its
    DEVICE_DEFAULT kernels, as on CUDA), the plugin registers no int32 kernel of its own that
    TensorFlow would pick, so shape arithmetic inside a GPU graph costs no device round trips.
    Its device kernels for int32 data carry a label, which only nodes the graph pass labels
    select (crates/plugin/src/graph/int32.rs; FloorMod, FloorDiv and Fill have none)."""
    from tensorflow.python.framework import kernels

    deferred = 0
    for op in ["AddV2", "Sub", "Mul", "FloorMod", "FloorDiv", "Maximum", "Minimum", "Equal", "Fill"]:
        regs = kernels.get_registered_kernels_for_op(op).kernel
        host_default = [
            k for k in regs
            if k.device_type == "DEFAULT" and k.host_memory_arg
            and any(tf.int32.as_datatype_enum in c.allowed_values.list.type for c in k.constraint)
        ]
        ours_i32 = [
            k for k in regs
            if k.device_type == "GPU" and k.priority == 1 and not k.label
            and any(tf.int32.as_datatype_enum in c.allowed_values.list.type for c in k.constraint)
        ]
        labeled = [
            k for k in regs
            if k.device_type == "GPU" and k.label == "tfwgpu_device_int32" and not k.host_memory_arg
            and any(tf.int32.as_datatype_enum in c.allowed_values.list.type for c in k.constraint)
        ]
        assert bool(labeled) == (op not in ("FloorMod", "FloorDiv", "Fill")), (op, labeled)
        ours_f32 = [
            k for k in regs
            if k.device_type == "GPU" and k.priority == 1
            and any(tf.float32.as_datatype_enum in c.allowed_values.list.type for c in k.constraint)
        ]
        assert ours_f32, f"{op}: the plugin registers no float32 kernel"
        if host_default:
            assert not ours_i32, f"{op}: int32 registered on the GPU over TensorFlow's host kernel"
            deferred += 1
    assert deferred >= 5

    import tensorflow_wgpu

    @tf.function
    def f(x):
        n = tf.shape(x)[1] * 2 + 1
        return tf.fill(tf.stack([n]), 1.0) + tf.reduce_sum(x)

    with tf.device("/GPU:0"):
        x = tf.ones([3, 4])
        before = tensorflow_wgpu.stats()
        y = f(x)
        after = tensorflow_wgpu.stats()
    assert y.shape == (9,) and float(y[0]) == 13.0
    ran = {k: after["gpu_ops"].get(k, 0) - before["gpu_ops"].get(k, 0) for k in after["gpu_ops"]}
    assert ran.get("AddV2", 0) == 1 and ran.get("Sum", 0) == 1
    assert ran.get("Mul", 0) == 0, "int32 Mul ran as a GPU kernel"


def test_int32_host_kernels_for_shape_arithmetic(tf):
    """int32 Pack/Sum/Prod, which TensorFlow keeps in host memory only on its own GPU device,
    run as the plugin's host kernels: right values, no device round trip. (Unpack has a
    TensorFlow DEVICE_DEFAULT host kernel, which is used.)"""
    import tensorflow_wgpu

    # Unknown dimensions, so that grappler cannot fold the shape arithmetic into constants.
    @tf.function(input_signature=[tf.TensorSpec([None, None, None], tf.float32)])
    def f(x):
        s = tf.shape(x)
        a, b, c = tf.unstack(s)
        # (grappler turns Prod(Shape(x)) into Size(x), so Prod gets a Pack.)
        n = tf.reduce_prod(tf.stack([a, b, c]))
        m = tf.reduce_sum(s)
        dims = tf.stack([n, m, a * b - c])
        return tf.fill(dims, 2.0) * tf.reduce_mean(x)

    with tf.device("/GPU:0"):
        x = tf.ones([2, 3, 4])
        before = tensorflow_wgpu.stats()
        y = f(x)
        after = tensorflow_wgpu.stats()
    assert y.shape == (24, 9, 2)
    np.testing.assert_array_equal(y.numpy(), np.full((24, 9, 2), 2.0, np.float32))
    host = {k: after["host_ops"].get(k, 0) - before["host_ops"].get(k, 0) for k in after["host_ops"]}
    for op, runs in [("Prod", 1), ("Sum", 1), ("Pack", 2)]:
        assert host.get(op) == runs, (op, host)
    assert "Unpack" not in host
    assert after["device_to_host"]["copies"] == before["device_to_host"]["copies"]
    # Float reductions still run on the GPU.
    assert after["gpu_ops"]["Mean"] > before["gpu_ops"].get("Mean", 0)
    # A bad axis is an error, not a crash.
    with tf.device("/GPU:0"), pytest.raises(tf.errors.InvalidArgumentError, match="Pack"):
        c = tf.constant([1, 2], tf.int32)
        tf.raw_ops.Pack(values=[c, c], axis=3)


def test_gather_from_a_gpu_variable_in_a_graph(tf):
    """tf.gather on a GPU variable inside tf.function (a ResourceGather node) runs as a read
    and a GPU gather, with batch_dims; eager gathers go through the package's hook."""
    import tensorflow_wgpu

    table = rng.standard_normal((2, 7, 3)).astype(np.float32)
    ids = np.array([[0, 6, 2], [5, 5, 1]], np.int32)
    with tf.device("/GPU:0"):
        v = tf.Variable(table)

        @tf.function
        def f(i):
            return tf.gather(v, i % 2), tf.gather(v, i, batch_dims=1, axis=1)

        before = tensorflow_wgpu.stats()["gpu_ops"].get("GatherV2", 0)
        a, b = f(tf.constant(ids))
        after = tensorflow_wgpu.stats()["gpu_ops"].get("GatherV2", 0)
        e = tf.gather(v, tf.constant(ids[0] % 2))
    assert after - before == 2
    np.testing.assert_array_equal(a.numpy(), table[ids % 2])
    np.testing.assert_array_equal(b.numpy(), np.stack([table[k][ids[k]] for k in range(2)]))
    np.testing.assert_array_equal(e.numpy(), table[ids[0] % 2])
