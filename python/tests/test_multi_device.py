"""Several tfwgpu devices in one process. CI machines have one adapter, so the multi-device
path is tested by opening that adapter twice (TFWGPU_VISIBLE_DEVICES=i,i): two wgpu devices
with their own queues and memory, /GPU:0 and /GPU:1 to TensorFlow, exactly what two GPUs
are to the plugin (copies between them go through the host either way)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest


def run_two_devices(code, timeout=900, env=None):
    import tensorflow_wgpu

    opened = [a for a in tensorflow_wgpu.adapters() if a["tensorflow_device"] == "/GPU:0"]
    index = opened[0]["index"]
    env = dict(os.environ, TFWGPU_VISIBLE_DEVICES=f"{index},{index}", TF_CPP_MIN_LOG_LEVEL="2",
               **(env or {}))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       env=env, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# TFWGPU_PEER=1: copies between the devices through a ring of host memory both import, ordered
# on the GPUs by a shared timeline semaphore where the driver has one (lavapipe has none: there
# the host waits for each copy's source), instead of the copier threads (crossdev.rs).
PEER = pytest.mark.parametrize("peer", ["", "1"], ids=["copier", "peer"])


@PEER
def test_copies_between_devices(tf, peer):
    out = run_two_devices(
        """
        import json
        import numpy as np
        import tensorflow as tf
        import tensorflow_wgpu
        rng = np.random.default_rng(1)
        res = {"gpus": [d.name for d in tf.config.list_logical_devices("GPU")], "ok": []}
        for dtype, shape in [(np.float32, (3, 5)), (np.int64, (7,)), (np.float16, (129,)),
                             (np.float32, (0, 4)), (np.bool_, (13,))]:
            a = (rng.standard_normal(shape) * 100).astype(dtype)
            with tf.device("/GPU:0"):
                x = tf.identity(tf.constant(a))
            with tf.device("/GPU:1"):
                y = tf.identity(x)          # GPU:0 -> GPU:1
            with tf.device("/GPU:0"):
                z = tf.identity(y)          # and back
            res["ok"].append(bool(y.device.endswith("GPU:1") and np.array_equal(y.numpy(), a)
                                  and np.array_equal(z.numpy(), a)))
        with tf.device("/GPU:1"):
            w = tf.constant(np.arange(6, dtype=np.float32)) * 2.0
        with tf.device("/GPU:0"):
            s = w + 1.0
        res["compute"] = s.numpy().tolist()
        res["between"] = tensorflow_wgpu.stats()["between_devices"]
        print(json.dumps(res))
        """,
        env={"TFWGPU_PEER": peer},
    )
    assert out["gpus"] == ["/device:GPU:0", "/device:GPU:1"]
    assert all(out["ok"]), out["ok"]
    assert out["compute"] == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
    between = out["between"]
    assert between["copies"] >= 8
    if not peer:
        assert between["routed"] == 0 and between["routes"] == []
    else:
        assert_routed(between, most=between["copies"])


def assert_routed(between, most):
    """Under TFWGPU_PEER=1 the copies between devices that a route takes (4-byte multiples) went
    through one in each direction, where the adapter can import host memory."""
    routes = between["routes"]
    print("peer routes:", routes)
    if not routes:
        pytest.skip("this adapter cannot import host memory: no peer route (copier path ran)")
    assert len(routes) == 2, routes
    assert 0 < between["routed"] <= most, between
    for r in routes:
        # Both directions took copies: a host-ordered route waited on the host for each, a
        # GPU-ordered one never.
        assert r["host_waits"] == 0 if r["gpu_ordered"] else r["host_waits"] > 0, r


@pytest.mark.parametrize("model,reduce,peer", [("mlp", "", ""), ("cnn", "", ""),
                                               ("cnn", "exchange", ""), ("cnn", "", "1")])
def test_mirrored_strategy_fit_matches_one_device(tf, model, reduce, peer):
    """MirroredStrategy over both devices trains the reference model with fit: replicas hold
    identical trainable weights after every step, and the losses match one device on the same global
    batch (the all-reduced mean gradient equals the full batch's up to summation order)."""
    out = run_two_devices(
        f"""
        import json
        import numpy as np
        import tensorflow as tf
        import keras
        from tensorflow_wgpu import models

        x, y = models.data(128)
        res = {{}}

        class Same(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                # Trainable weights; BatchNormalization's moving statistics follow each
                # replica's own batch unless the layer is synchronized (as on CUDA).
                for v in self.model.trainable_weights:
                    vals = [t.numpy() for t in v.value.values]
                    same = all(np.array_equal(vals[0], o) for o in vals[1:])
                    res["identical"] = res.get("identical", True) and same and len(vals) == 2

        def train(strategy, cb):
            keras.utils.set_random_seed(3)
            with strategy.scope():
                m, opt, logits = models.build(keras, "{model}")
                m.compile(optimizer=opt, loss=models.loss_fn(keras, logits))
            h = m.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, callbacks=cb)
            return h.history["loss"]

        two = tf.distribute.MirroredStrategy(["/GPU:0", "/GPU:1"])
        res["replicas"] = two.num_replicas_in_sync
        res["two"] = train(two, [Same()])
        res["one"] = train(tf.distribute.OneDeviceStrategy("/GPU:0"), [])
        import tensorflow_wgpu
        res["between"] = tensorflow_wgpu.stats()["between_devices"]
        print(json.dumps(res))
        """,
        env={"TFWGPU_MIRRORED_REDUCE": reduce, "TFWGPU_PEER": peer},
    )
    if peer:
        assert_routed(out["between"], most=out["between"]["copies"])
    assert out["replicas"] == 2
    assert out["identical"] is True
    import numpy as np

    # Dropout draws its masks per replica, so with dropout the runs differ by the masks:
    # same trend, not the same numbers.
    np.testing.assert_allclose(out["two"], out["one"], rtol=5e-2)
    assert out["two"][-1] < out["two"][0]


@pytest.mark.parametrize("setting", ["", "tensorflow", "exchange"])
def test_mirrored_strategy_reduces_to_one_device_by_default(tf, setting):
    """Over tfwgpu GPUs MirroredStrategy() all-reduces with ReductionToOneDevice (the ring's
    hops each cross the host); TFWGPU_MIRRORED_REDUCE=tensorflow keeps TensorFlow's collective
    ring, =exchange the exchange all-reduce (every device sums the replicas' values itself), and
    an explicit cross_device_ops or a list with a CPU device is left alone. The sums (to the
    host, and all-reduced in the replicas: each on its own device) are the same either way."""
    out = run_two_devices(
        """
        import json
        import tensorflow as tf

        def kind(s):
            return type(s.extended._cross_device_ops).__name__

        res = {}
        res["default"] = kind(tf.distribute.MirroredStrategy())
        res["listed"] = kind(tf.distribute.MirroredStrategy(["/GPU:0", "/GPU:1"]))
        res["explicit"] = kind(tf.distribute.MirroredStrategy(
            cross_device_ops=tf.distribute.HierarchicalCopyAllReduce()))
        from tensorflow_wgpu import _hooks
        res["with_cpu"] = _hooks._mirrored_reduce(["/GPU:0", "/CPU:0"]) is None
        s = tf.distribute.MirroredStrategy()
        v = s.run(lambda: tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group + 1,
                                   tf.float32) * tf.constant([1.0, 2.0, 3.0]))
        res["sum"] = s.reduce(tf.distribute.ReduceOp.SUM, v, axis=None).numpy().tolist()

        def all_reduced():  # eagerly: each replica's result stays on its device
            def fn():
                ctx = tf.distribute.get_replica_context()
                x = tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32) * tf.constant(
                    [1.0, 2.0, 3.0])
                return (ctx.all_reduce(tf.distribute.ReduceOp.SUM, x),
                        ctx.all_reduce(tf.distribute.ReduceOp.MEAN, x))
            return s.run(fn)

        total, mean = all_reduced()
        res["all_sum"] = [t.numpy().tolist() for t in s.experimental_local_results(total)]
        res["all_mean"] = [t.numpy().tolist() for t in s.experimental_local_results(mean)]
        res["all_devices"] = [t.device for t in s.experimental_local_results(total)]
        print(json.dumps(res))
        """,
        env={"TFWGPU_MIRRORED_REDUCE": setting},
    )
    ring = "CollectiveAllReduce"
    want = {"tensorflow": ring, "exchange": "ExchangeAllReduce"}.get(setting, "ReductionToOneDevice")
    assert out["default"] == want
    assert out["listed"] == want
    assert out["explicit"] == "HierarchicalCopyAllReduce"
    assert out["with_cpu"] is True
    assert out["sum"] == [3.0, 6.0, 9.0]
    assert out["all_sum"] == [[3.0, 6.0, 9.0]] * 2
    assert out["all_mean"] == [[1.5, 3.0, 4.5]] * 2
    assert [d[-5:] for d in out["all_devices"]] == ["GPU:0", "GPU:1"]


@PEER
def test_copies_between_devices_stay_ordered(tf, peer):
    """Copies between devices return before the data has moved (a copier thread finishes
    them): work that consumes a copied tensor, and the source buffers being reused right after,
    must still see every value in order. A chain that ping-pongs one tensor between the devices
    with arithmetic on both sides, eagerly and inside one tf.function."""
    out = run_two_devices(
        """
        import json
        import numpy as np
        import tensorflow as tf
        import tensorflow_wgpu
        rng = np.random.default_rng(5)
        a = rng.standard_normal((257, 33)).astype(np.float32)

        def step(x, i):
            with tf.device("/GPU:1"):
                x = tf.identity(x) * 2.0 + float(i)
            with tf.device("/GPU:0"):
                x = tf.identity(x) - 1.0
            return x

        want = a.copy()
        for i in range(20):
            want = want * 2.0 + i - 1.0
            want = want / 4.0
        res = {}
        with tf.device("/GPU:0"):
            x = tf.constant(a)
        for i in range(20):
            x = step(x, i)
            with tf.device("/GPU:0"):
                x = x * 0.25
        res["eager"] = float(np.max(np.abs(x.numpy() - want)))

        @tf.function
        def f(x):
            for i in range(20):
                with tf.device("/GPU:1"):
                    x = tf.identity(x) * 2.0 + float(i)
                with tf.device("/GPU:0"):
                    x = (tf.identity(x) - 1.0) * 0.25
            return x

        with tf.device("/GPU:0"):
            y = f(tf.constant(a))
        res["graph"] = float(np.max(np.abs(y.numpy() - want)))
        res["scale"] = float(np.max(np.abs(want)))
        res["between"] = tensorflow_wgpu.stats()["between_devices"]
        print(json.dumps(res))
        """,
        env={"TFWGPU_PEER": peer},
    )
    # Every step is exact in float32 up to one rounding per operation (x*2+i, -1, *0.25).
    tol = 1e-6 * max(out["scale"], 1.0) * 20
    assert out["eager"] <= tol, out
    assert out["graph"] <= tol, out
    if peer:
        assert_routed(out["between"], most=out["between"]["copies"])


@pytest.mark.parametrize("batch_ops", ["2", "128"])
def test_two_devices_recording_at_once_match_the_cpu(tf, batch_ops):
    """Both devices record at the same time (TensorFlow runs each device's part of one
    tf.function on its own thread; with tiny batches every thread also encodes and submits
    batches while the others record), with copies between them along the way: every call's
    result equals the CPU's exactly (small integers in float32: every operation is exact)."""
    out = run_two_devices(
        """
        import json
        import numpy as np
        import tensorflow as tf
        import tensorflow_wgpu
        rng = np.random.default_rng(7)
        a = rng.integers(-3, 4, (33, 65)).astype(np.float32)
        b = rng.integers(-3, 4, (33, 65)).astype(np.float32)

        def chain(x, y, k):
            for i in range(40):
                x = tf.math.floormod(x * 3.0 + y - float(i + k), 97.0)
                y = tf.maximum(y, x) - tf.minimum(x, 5.0)
                y = tf.math.floormod(y, 89.0)
                # A layout kernel between the elementwise ones: the fusion pass cannot merge
                # the chain into one kernel, so each device records ~120 kernels per call.
                x = tf.reverse(x, [1])
            return x, y

        def body(x0, y0, x1, y1, dev0, dev1):
            for k in range(3):
                with tf.device(dev0):
                    x0, y0 = chain(x0, y0, k)
                with tf.device(dev1):
                    x1, y1 = chain(x1, y1, k + 7)
                with tf.device(dev0):
                    x0 = tf.math.floormod(x0 + tf.identity(y1), 101.0)   # GPU:1 -> GPU:0
                with tf.device(dev1):
                    x1 = tf.math.floormod(x1 - tf.identity(y0), 103.0)   # GPU:0 -> GPU:1
            return x0, y0, x1, y1

        gpu = tf.function(lambda *v: body(*v, "/GPU:0", "/GPU:1"))
        cpu = tf.function(lambda *v: body(*v, "/CPU:0", "/CPU:0"))
        want = [t.numpy() for t in cpu(a, b, b, a)]
        res = {"exact": []}
        before = tensorflow_wgpu.stats()["between_devices"]["copies"]
        for _ in range(4):
            got = gpu(a, b, b, a)
            res["exact"].append(all(np.array_equal(g.numpy(), w) for g, w in zip(got, want)))
        s = tensorflow_wgpu.stats()
        res["between"] = s["between_devices"]["copies"] - before
        res["submits"] = s["runtime"]["submits"]
        print(json.dumps(res))
        """,
        env={"TFWGPU_BATCH_OPS": batch_ops},
    )
    assert all(out["exact"]), out
    # Each call crosses twice per round (and GPU:1's results come back to GPU:0): both
    # devices ran their chains.
    assert out["between"] >= 4 * 3 * 2, out
