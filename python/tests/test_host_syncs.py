"""Host syncs and stream-executor traffic of the plugin (issue 7): copies TensorFlow asks for
cost what they must, and no more. The plugin's counters (`tensorflow_wgpu.stats()`) give the
device-to-host copies TensorFlow asked for (`device_to_host`), the runtime's reads back to the
host (`runtime.reads`: each one waits for the GPU; the runtime's host mirror answers some
copies without one) and the stream-executor calls TensorFlow made (`stream_executor`)."""
import numpy as np
import pytest

import tensorflow_wgpu
from conftest import ran_on_gpu


def _counts():
    s = tensorflow_wgpu.stats()
    return {
        "d2h": s["device_to_host"]["copies"],
        "h2d": s["host_to_device"]["copies"],
        "reads": s["runtime"]["reads"],
        "sync": s["stream_executor"]["synchronize_all_activity"]["calls"],
    }


def _delta(a, b):
    return {k: b[k] - a[k] for k in a}


def test_stats_report_stream_executor_calls_and_runtime_reads(tf):
    s = tensorflow_wgpu.stats()
    for k in ("synchronize_all_activity", "block_host_until_done", "block_host_for_event",
              "memcpy_dtoh", "memcpy_htod", "memcpy_dtod", "memset", "record_event",
              "get_event_status", "host_callback", "allocate", "deallocate"):
        assert set(s["stream_executor"][k]) == {"calls", "wall_us"}, k
    for k in ("submits", "dispatches", "copies", "uploads", "reads", "bind_groups"):
        assert isinstance(s["runtime"][k], int), k
    before = _counts()
    with tf.device("/GPU:0"):
        x = tf.identity(tf.constant([1.0, 2.0, 3.0]))
    assert x.numpy().tolist() == [1.0, 2.0, 3.0]
    d = _delta(before, _counts())
    # Reading an eager tensor back: TensorFlow synchronizes the device first
    # (TensorHandle::CopyToDevice calls Device::Sync), then copies.
    assert d["h2d"] >= 1 and d["d2h"] >= 1 and d["sync"] >= 1, d


@pytest.mark.parametrize(
    "dtype,values",
    [
        ("bool", [True]),
        ("bool", [False, True, True]),
        ("uint8", [7]),
        ("uint8", [200, 1]),
        ("uint8", [1, 2, 3, 4, 5]),  # four whole bytes and a tail of one
        ("int8", [-1, -128, 127, 5, 6, 7, 8]),
        ("bool", [True] * 9 + [False] * 2),
    ],
)
def test_sub_word_uploads_do_not_read_the_device(tf, dtype, values):
    """A host-to-device copy whose size is not a multiple of 4 bytes (a bool scalar: Keras's
    `Optional.has_value()` flag crosses to the device this way every training step) is
    written without reading the device back: the runtime reads no more than the copies to the
    host that TensorFlow asked for. The bytes are exact, also for the upload placed right
    behind."""
    host = np.array(values, dtype=dtype)
    for _ in range(2):
        before = _counts()
        with tf.device("/GPU:0"):
            t = tf.identity(tf.constant(host))
            assert t.device.endswith("GPU:0")
            # A second upload right behind the first: BFC places it in the next chunk.
            u = tf.identity(tf.constant(host[::-1].copy()))
        got, got_u = t.numpy(), u.numpy()
        d = _delta(before, _counts())
        np.testing.assert_array_equal(got, host)
        np.testing.assert_array_equal(got_u, host[::-1])
        assert d["h2d"] == 2, d
        # No read beyond the copies TensorFlow asked for (the runtime's host mirror may
        # answer some of those without one).
        assert d["reads"] <= d["d2h"], d


def test_optional_has_value_needs_no_device_read(tf):
    """Keras fit's per-step check `if not opt_outputs.has_value()`: with eager ops as one-op
    functions (TensorFlow's default, kept by ours) TensorFlow puts the flag on the device (one
    1-byte upload), then reads it back (a device sync, then a copy to the host): neither the
    upload nor the read waits for the GPU. With `TFWGPU_EAGER_OPS_DIRECT=1` the flag stays on
    the host (no copy at all, tests/test_eager_direct.py)."""
    with tf.device("/GPU:0"):
        opt = tf.experimental.Optional.from_value(tf.constant([1.0, 2.0]))
        assert bool(opt.has_value())  # warm-up: kernels, functions
        before = _counts()
        for _ in range(5):
            assert bool(opt.has_value())
    d = _delta(before, _counts())
    assert d["d2h"] <= 5, d
    # The flag read back is the byte just uploaded, with nothing written in between: the
    # runtime's host mirror answers it, no read of the device at all.
    assert d["reads"] == 0, d


def test_reads_after_a_kernel_wrote_go_to_the_device(tf):
    """After a kernel wrote a tensor that the host had uploaded, reading it goes to the device
    and sees the kernel's result (no stale host copy)."""
    with tf.device("/GPU:0"):
        v = tf.Variable(np.float32(5))
        v.assign(tf.constant(np.float32(1)))
        v.assign_add(tf.constant(np.float32(1)))  # a kernel writes the variable on the device
        before = _counts()
        assert v.numpy() == 2
        d = _delta(before, _counts())
        assert d["reads"] >= 1, d
        x = tf.identity(tf.constant(np.array([3.5], dtype=np.float32)))
        y = x * 2.0
        assert x.numpy()[0] == 3.5 and y.numpy()[0] == 7.0


def test_copy_events_complete_when_recorded(tf):
    """An event TensorFlow records after a host-to-device copy (its `done` callback: the copy's
    consumers wait for it) is complete at TensorFlow's first poll: the copy's bytes were taken
    into staging memory by `memcpy_htod`, and the consumers are recorded after the copy on the
    one in-order queue, so nothing waits for the GPU (TFWGPU_EVENTS=completed: it did, polled
    every 10 us until then). Results are unchanged."""
    host = np.arange(24, dtype=np.float32).reshape(4, 6)

    @tf.function
    def step(x):
        return tf.reduce_sum(x * 2.0, axis=1)

    with tf.device("/GPU:0"):
        step(tf.constant(host)).numpy()  # warm-up: tracing, pipelines
        s0 = tensorflow_wgpu.stats()["stream_executor"]
        for i in range(6):
            got = step(tf.constant(host + i)).numpy()
            np.testing.assert_allclose(got, ((host + i) * 2.0).sum(axis=1), rtol=1e-6)
        s1 = tensorflow_wgpu.stats()["stream_executor"]
    recorded = s1["record_event"]["calls"] - s0["record_event"]["calls"]
    polled = s1["get_event_status"]["calls"] - s0["get_event_status"]["calls"]
    assert recorded >= 6, (recorded, polled)
    assert polled <= recorded, (recorded, polled)


# ---- TensorFlow's Device::Sync without waiting for the GPU (TFWGPU_SYNC) ----

def _opt_flag(tf):
    """A new 1-byte flag the host wrote to the device (one per step: TensorFlow reads a tensor
    back once), read the way Keras fit reads its `has_value()` flag every step while eager ops
    run as one-op functions (the default; `TFWGPU_EAGER_OPS_DIRECT=1` keeps it on the host):
    each read is TensorFlow's device sync followed by a copy that the runtime's host mirror
    answers (no read of the device)."""
    with tf.device("/GPU:0"):
        return tf.identity(tf.constant(True))


def test_sync_mode_default_is_ordered(tf):
    assert tensorflow_wgpu.stats()["sync"]["mode"] == "ordered"


def test_values_read_after_an_ordered_sync_are_the_new_values(tf):
    """TensorFlow syncs the device before every read of an eager tensor; the sync no longer
    waits for the GPU, the copy does: each value read is the one the last step wrote, also for a
    variable updated on the device every step and read right after a flag that answers from
    the host."""
    rng = np.random.default_rng(7)
    w0 = rng.standard_normal((96, 96)).astype(np.float32) * 0.1
    xs = [rng.standard_normal((64, 96)).astype(np.float32) for _ in range(6)]
    with tf.device("/GPU:0"):
        w = tf.Variable(w0)
        acc = tf.Variable(np.zeros((96,), np.float32))

        @tf.function
        def step(x):
            h = x
            for _ in range(4):  # enough GPU work to be still queued at the sync
                h = tf.tanh(tf.matmul(h, w))
            acc.assign_add(tf.reduce_sum(h, axis=0))
            w.assign_sub(0.01 * tf.matmul(x, h, transpose_a=True) / 64.0)
            return tf.reduce_mean(h)

        want_w, want_acc = w0.astype(np.float64), np.zeros((96,))
        s0 = tensorflow_wgpu.stats()
        for x in xs:
            loss = step(tf.constant(x))
            assert bool(_opt_flag(tf))  # a device sync (ordered), answered from the host
            h = x.astype(np.float64)
            for _ in range(4):
                h = np.tanh(h @ want_w)
            want_acc = want_acc + h.sum(axis=0)
            want_w = want_w - 0.01 * (x.T @ h) / 64.0
            np.testing.assert_allclose(loss.numpy(), h.mean(), rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(acc.numpy(), want_acc, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(w.numpy(), want_w, rtol=1e-4, atol=1e-5)
        s1 = tensorflow_wgpu.stats()
    syncs = (s1["stream_executor"]["synchronize_all_activity"]["calls"]
             - s0["stream_executor"]["synchronize_all_activity"]["calls"])
    assert syncs >= 4 * len(xs), syncs


def test_memory_freed_after_an_ordered_sync_is_reused_intact(tf):
    """A sync returns while the step's kernels are still queued; TensorFlow then frees their
    tensors and its allocator hands the same memory to the next tensors at once (the host's
    upload of new data, the next kernels). On the one in-order queue the queued kernels still
    read and write what they were given: every result is exact."""
    rng = np.random.default_rng(11)
    n = 48 * 1024  # 192 KiB: above the direct-upload threshold and below it, both paths
    results = []
    with tf.device("/GPU:0"):
        @tf.function
        def work(a):
            h = a
            for _ in range(6):
                h = h * 1.5 + 1.0
            return h, tf.reduce_sum(h)

        for i in range(8):
            size = n if i % 2 else 4096
            x = rng.integers(-8, 8, size).astype(np.float32)
            a = tf.identity(tf.constant(x))
            h, s = work(a)
            assert bool(_opt_flag(tf))  # ordered sync: h and s may still be queued
            del a  # freed now; the next upload can take its memory
            y = rng.integers(-8, 8, size).astype(np.float32)
            b = tf.identity(tf.constant(y))
            c = b * 3.0
            results.append((x, y, h, s, c))
        for x, y, h, s, c in results:
            want = x.astype(np.float64)
            for _ in range(6):
                want = want * 1.5 + 1.0
            np.testing.assert_array_equal(h.numpy(), want.astype(np.float32))
            np.testing.assert_allclose(s.numpy(), want.sum(), rtol=1e-5)
            np.testing.assert_array_equal(c.numpy(), y * 3.0)


_LOSS_SCRIPT = r"""
import ctypes, sys, time
import numpy as np
import tensorflow as tf
import tensorflow_wgpu

lib = tensorflow_wgpu._plugin()
with tf.device("/GPU:0"):
    opt = tf.experimental.Optional.from_value(tf.constant([1.0]))
    w = tf.Variable(np.ones((64, 64), np.float32))

    @tf.function
    def step():
        h = tf.matmul(w, w)
        w.assign(h / 64.0)
        return tf.reduce_sum(h)

    assert step().numpy() == 64.0 ** 3
    print("mode", tensorflow_wgpu.stats()["sync"]["mode"], flush=True)
    step()
    time.sleep(0.5)  # TensorFlow's EventMgr has taken the step's events (an event in error is fatal to it)
    assert lib.tfwgpu_test_lose_device(0) == 0
    try:
        w.numpy()  # TensorHandle::CopyToDevice: Device::Sync, then the copy
        print("read NO ERROR", flush=True)
    except Exception as e:  # the error TensorFlow raises
        print("read ERROR", type(e).__name__, str(e).splitlines()[0][:200], flush=True)
"""


@pytest.mark.parametrize("mode", ["ordered", "completed"])
def test_device_errors_surface_at_the_sync(tf, mode, tmp_path):
    """A device lost after a step (the test hook destroys the wgpu device) surfaces as an error
    at the next read of a device tensor (TensorFlow's Device::Sync, then the copy), the same
    whether the sync waits for the GPU or not: no stale value is returned. (An event that
    reports an error is fatal to TensorFlow's EventMgr, device_event_mgr.cc "Unexpected Event
    status", on CUDA too: the script lets the step's events be consumed first.)"""
    import os
    import subprocess
    import sys

    script = tmp_path / "lose.py"
    script.write_text(_LOSS_SCRIPT)
    env = dict(os.environ, TFWGPU_TEST_HOOKS="1", TFWGPU_SYNC=mode)
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                       timeout=300)
    out = p.stdout
    assert f"mode {mode}" in out, (out, p.stderr[-3000:])
    assert "read ERROR" in out and "device lost" in out, (out, p.stderr[-3000:])
    assert "NO ERROR" not in out, out


# ---- int32 ops on device tensors stay on the device (crates/plugin/src/graph/int32.rs) ----

def _argmax_fn(tf):
    import keras

    @tf.function
    def f(logits):
        # Keras's argmax tests every element's sign bit (Less(BitwiseAnd(Bitcast(x)), 0)):
        # int32 data computed on the GPU. (An int32 result of a function goes to host memory,
        # as on CUDA: the class indices are returned as float32, as the metrics use them.)
        i = keras.ops.argmax(logits, axis=-1)
        return tf.cast(i, tf.float32), tf.reduce_sum(logits, axis=-1)

    return f


def _logits():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 10)).astype(np.float32)
    x[0] = -0.0  # negative zeros everywhere: argmax must still pick index 0 ...
    x[1, :] = -1.0
    x[1, 4] = -0.0  # ... and -0.0 above the negatives
    x[2, 3] = x[2, 7] = 9.0  # a tie: the first
    return x


def test_keras_argmax_does_not_read_the_device_mid_function(tf):
    """Keras's `argmax` (behind the `accuracy` metrics, every training step of a classifier)
    computes an int32 tensor on the GPU and compares it with `Less`, whose int32 kernel
    TensorFlow keeps in host memory: a copy to the host in the middle of the function, which
    waits for every GPU command before it. The graph pass gives such nodes the runtime's
    device-memory kernel: the call reads nothing back, and the results are TensorFlow's CPU
    results. With the pass off (`TFWGPU_DEVICE_INT32=0`, read when a graph is optimized) the
    copy is back."""
    import os

    x = _logits()
    with tf.device("/CPU:0"):
        want_i, want_s = (t.numpy() for t in _argmax_fn(tf)(tf.constant(x)))
    assert want_i[0] == 0 and want_i[1] == 4 and want_i[2] == 3
    with tf.device("/GPU:0"):
        xd = tf.identity(tf.constant(x))
        f = _argmax_fn(tf)
        f(xd)  # tracing, pipelines
        before = _counts()
        with ran_on_gpu("Less", "BitwiseAnd"):
            i, s = f(xd)
            d = _delta(before, _counts())
        np.testing.assert_array_equal(i.numpy(), want_i)
        np.testing.assert_allclose(s.numpy(), want_s, rtol=1e-6, atol=1e-6)
        assert d["d2h"] == 0 and d["reads"] == 0, d

        os.environ["TFWGPU_DEVICE_INT32"] = "0"
        try:
            g = _argmax_fn(tf)
            g(xd)
            before = _counts()
            i, _ = g(xd)
            d = _delta(before, _counts())
        finally:
            del os.environ["TFWGPU_DEVICE_INT32"]
        np.testing.assert_array_equal(i.numpy(), want_i)
        assert d["d2h"] >= 1, d


_INT32_OPS = {
    "Abs": lambda tf, a, b: tf.abs(a),
    "Add": lambda tf, a, b: tf.raw_ops.Add(x=a, y=b),
    "AddV2": lambda tf, a, b: a + b,
    # (AddN of one tensor repeated becomes a Mul in Grappler.)
    "AddN": lambda tf, a, b: tf.add_n(
        [a, b if b.shape == a.shape else tf.bitwise.bitwise_xor(a, 5), a]
    ),
    "Equal": lambda tf, a, b: tf.equal(a, b),
    "Greater": lambda tf, a, b: a > b,
    "GreaterEqual": lambda tf, a, b: a >= b,
    "Less": lambda tf, a, b: a < b,
    "LessEqual": lambda tf, a, b: a <= b,
    "Maximum": lambda tf, a, b: tf.maximum(a, b),
    "Minimum": lambda tf, a, b: tf.minimum(a, b),
    "Mul": lambda tf, a, b: a * b,
    "Neg": lambda tf, a, b: -a,
    "NotEqual": lambda tf, a, b: tf.not_equal(a, b),
    "Sign": lambda tf, a, b: tf.sign(a),
    # Grappler turns Square(a - c) into SquaredDifference: square a BitwiseXor instead.
    "Square": lambda tf, a, b: tf.square(tf.bitwise.bitwise_xor(a, 1)),
    "SquaredDifference": lambda tf, a, b: tf.math.squared_difference(a, b),
    "Sub": lambda tf, a, b: a - b,
    "SelectV2": lambda tf, a, b: tf.where(a > b, a, b),
}


@pytest.mark.parametrize("op", sorted(_INT32_OPS))
@pytest.mark.parametrize("rhs", ["tensor", "scalar", "row"])
def test_int32_ops_on_device_tensors_match_the_cpu(tf, op, rhs):
    """Every int32 op the graph pass may keep on the device, on int32 tensors the GPU computed
    (the low bits of float32 values, from Bitcast and BitwiseAnd), against a second operand of
    the same shape, a constant scalar or a broadcast row: the values TensorFlow's CPU kernels
    give, computed on the GPU with nothing read back during the call."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    y = rng.standard_normal((6, 5)).astype(np.float32)
    y[0, :2] = x[0, :2]  # equal elements

    @tf.function
    def f(x, y):
        # Values in [-512, 511], squares and products far from overflow.
        a = tf.bitwise.bitwise_and(tf.bitcast(x, tf.int32), 1023) - 512
        if rhs == "tensor":
            b = tf.bitwise.bitwise_and(tf.bitcast(y, tf.int32), 1023) - 512
        elif rhs == "scalar":
            b = tf.constant(7, tf.int32)
        else:
            b = tf.constant(np.arange(-2, 3, dtype=np.int32))
        # Returned as float32 (exact here): an int32 result of a function goes to host memory.
        return tf.cast(_INT32_OPS[op](tf, a, b), tf.float32)

    with tf.device("/CPU:0"):
        want = f(tf.constant(x), tf.constant(y)).numpy()
    with tf.device("/GPU:0"):
        xd, yd = tf.identity(tf.constant(x)), tf.identity(tf.constant(y))
        f(xd, yd)
        before = _counts()
        with ran_on_gpu(op):
            got = f(xd, yd)
            d = _delta(before, _counts())
        assert d["d2h"] == 0 and d["reads"] == 0, d
        np.testing.assert_array_equal(got.numpy(), want)


# ---- shape arithmetic of unknown batch sizes stays on the host (host_ops: GatherV2, DynamicStitch) ----

def _host_counts():
    return tensorflow_wgpu.stats()["host_ops"]


def test_int32_gather_and_stitch_of_shapes_run_on_the_host(tf):
    """GatherV2 and DynamicStitch of int32 on GPU:0 are the runtime's host kernels (as TensorFlow's
    CUDA build keeps them), with TensorFlow's CPU results and errors; a gather of GPU-computed
    int32 data inside a function keeps the device kernel (the graph pass's label)."""
    shape = np.array([64, 28, 28, 16], np.int32)
    with tf.device("/GPU:0"):
        before = _host_counts()
        g = tf.gather(tf.constant(shape), [0, 1, 2])
        m = tf.gather(tf.constant(np.arange(12, dtype=np.int32).reshape(3, 4)), [2, 0], axis=1)
        st = tf.dynamic_stitch([tf.constant([0, 1, 2, 3]), tf.constant([1, 2])],
                               [tf.constant(shape), tf.constant([1, 1])])
        after = _host_counts()
        np.testing.assert_array_equal(g.numpy(), [64, 28, 28])
        np.testing.assert_array_equal(m.numpy(), np.arange(12).reshape(3, 4)[:, [2, 0]])
        np.testing.assert_array_equal(st.numpy(), [64, 1, 1, 16])
        assert after.get("GatherV2", 0) - before.get("GatherV2", 0) == 2, (before, after)
        assert after.get("DynamicStitch", 0) - before.get("DynamicStitch", 0) == 1, (before, after)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[0\] = 4 is not in \[0, 4\)"):
            tf.gather(tf.constant(shape), [4]).numpy()

        @tf.function
        def picked(logits):
            i = tf.argmax(logits, axis=-1, output_type=tf.int32)  # int32 data on the GPU
            return tf.cast(tf.gather(i, [3, 0, 1]), tf.float32)

        x = np.random.default_rng(2).standard_normal((8, 5)).astype(np.float32)
        xd = tf.identity(tf.constant(x))
        picked(xd)
        before = _counts()
        with ran_on_gpu("GatherV2"):
            got = picked(xd)
            d = _delta(before, _counts())
        np.testing.assert_array_equal(got.numpy(), x.argmax(axis=-1)[[3, 0, 1]])
        assert d["d2h"] == 0 and d["reads"] == 0, d


def test_batch_norm_and_global_pooling_with_unknown_batch_do_not_read_mid_step(tf):
    """A Keras training step with an unknown batch size: batch norm's moments and the global
    average pooling's gradient compute their element counts from `Shape(x)` (GatherV2, Prod,
    DynamicStitch). On the host, as on CUDA, none of it waits for the GPU (a GatherV2 on the
    device read its result back twice per layer, and a DynamicStitch without a device kernel
    took its `Shape` to the CPU, which copied all of x there); the loss and gradients are
    TensorFlow's CPU results."""
    import keras

    rng = np.random.default_rng(9)
    x = rng.standard_normal((16, 8, 8, 3)).astype(np.float32)
    y = rng.integers(0, 4, 16).astype(np.int32)
    results = {}
    for device in ["/CPU:0", "/GPU:0"]:
        with tf.device(device):
            keras.utils.set_random_seed(3)
            model = keras.Sequential([
                keras.Input((8, 8, 3)),
                keras.layers.Conv2D(6, 3, padding="same"),
                keras.layers.BatchNormalization(),
                keras.layers.ReLU(),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(4),
            ])
            loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

            @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 3]), tf.TensorSpec([None], tf.int32)])
            def step(xb, yb):
                with tf.GradientTape() as tape:
                    loss = loss_fn(yb, model(xb, training=True))
                return loss, tape.gradient(loss, model.trainable_weights)

            xd, yd = tf.identity(tf.constant(x)), tf.identity(tf.constant(y))
            step(xd, yd)
            before = _counts()
            loss, grads = step(xd, yd)
            d = _delta(before, _counts())
            results[device] = (loss.numpy(), [g.numpy() for g in grads], d)
    loss, grads, d = results["/GPU:0"]
    assert d["d2h"] == 0 and d["reads"] == 0, d
    want_loss, want_grads, _ = results["/CPU:0"]
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5)


def test_bounded_loop_condition_stays_on_the_host(tf):
    """A `tf.while_loop` with `maximum_iterations` tests `LogicalAnd(Less(i, max), Less(t,
    n))` every iteration; the int32 comparisons are host-memory results, and the graph pass
    keeps their `LogicalAnd` on the host (the runtime's labeled host kernel): the loop reads
    nothing back from the GPU. With the pass off (`TFWGPU_HOST_LOGIC=0`) the condition ran on
    the GPU and `LoopCond` read it back once per test. Same results as the CPU."""
    import os

    from conftest import ran_on_host

    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)

    def make():
        @tf.function(input_signature=[tf.TensorSpec([3, 4])])
        def f(v):
            def body(t, acc):
                return t + 1, tf.tanh(acc * 1.5 + v)

            _, out = tf.while_loop(
                lambda t, acc: t < 9, body, (tf.constant(0), v), maximum_iterations=7
            )
            return out

        return f

    with tf.device("/CPU:0"):
        want = make()(tf.constant(x)).numpy()
    with tf.device("/GPU:0"):
        xd = tf.identity(tf.constant(x))
        f = make()
        f(xd)
        before = _counts()
        with ran_on_host("LogicalAnd"):
            got = f(xd)
            d = _delta(before, _counts())
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)
        assert d["reads"] == 0, d

        os.environ["TFWGPU_HOST_LOGIC"] = "0"
        try:
            g = make()
            g(xd)
            before = _counts()
            got = g(xd)
            d = _delta(before, _counts())
        finally:
            del os.environ["TFWGPU_HOST_LOGIC"]
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)
        # Seven iterations and the last test.
        assert d["reads"] >= 8, d


@pytest.mark.parametrize("layer", ["GRU", "LSTM", "SimpleRNN"])
def test_recurrent_training_step_reads_nothing_mid_step(tf, layer):
    """A recurrent layer's training step over 20 timesteps: the loop conditions stay on the
    host (above), and the shapes the forward loop pushes onto TensorLists for the gradient
    (int32 vectors the host wrote, ~11 per GRU timestep) are read back from the runtime's host
    mirror, which now holds thousands of them (64 before: a Keras GRU's `fit` step read the GPU
    back ~170 times). Loss and gradients are the CPU's."""
    import keras

    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 20, 3)).astype(np.float32)
    y = rng.standard_normal((4, 5)).astype(np.float32)
    results = {}
    for device in ["/CPU:0", "/GPU:0"]:
        with tf.device(device):
            keras.utils.set_random_seed(3)
            # Keras's generic loop (the fused op's step: test_ops_rnn.py).
            rnn = getattr(keras.layers, layer)
            m = keras.Sequential([keras.Input((20, 3)), rnn(5) if layer == "SimpleRNN" else rnn(5, use_cudnn=False)])

            @tf.function(input_signature=[tf.TensorSpec([None, 20, 3]), tf.TensorSpec([None, 5])])
            def step(xb, yb):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(m(xb, training=True) - yb))
                return loss, tape.gradient(loss, m.trainable_weights)

            xd, yd = tf.identity(tf.constant(x)), tf.identity(tf.constant(y))
            step(xd, yd)
            before = _counts()
            loss, grads = step(xd, yd)
            d = _delta(before, _counts())
            results[device] = (loss.numpy(), [g.numpy() for g in grads], d)
    loss, grads, d = results["/GPU:0"]
    assert d["reads"] == 0, d
    want_loss, want_grads, _ = results["/CPU:0"]
    # 20 steps of the recurrence in float32, summed in another order.
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
