"""Eager ops run as kernels, not one-op functions, with `TFWGPU_EAGER_OPS_DIRECT=1` when a
tfwgpu GPU is listed (issue 7; `tensorflow_wgpu._hooks`; off by default: slower on the H200).

TensorFlow 2.21 wraps every eager op in a function; a function's outputs live on its device,
so `OptionalHasValue` on a tfwgpu GPU (its kernel writes `has_value` in host memory) had its
flag uploaded to the device, and `bool()` of it synced the device and read the byte back:
Keras `fit` does this every step. Run directly, the flag stays on the host.
"""
import json
import os
import subprocess
import sys

import numpy as np

_HAS_VALUE = r"""
import json
import numpy as np
import tensorflow as tf
import tensorflow_wgpu


def counts():
    s = tensorflow_wgpu.stats()
    return {
        "h2d": s["host_to_device"]["copies"],
        "d2h": s["device_to_host"]["copies"],
        "sync": s["stream_executor"]["synchronize_all_activity"]["calls"],
    }


with tf.device("/GPU:0"):

    @tf.function
    def full(x):
        return tf.experimental.Optional.from_value(x * 2.0)

    @tf.function
    def empty():
        return tf.experimental.Optional.empty(tf.TensorSpec([3], tf.float32))

    some, none = full(tf.ones([3])), empty()
    some.has_value()  # the kernel instantiated
    before = counts()
    flags = [bool(some.has_value()), bool(none.has_value())]
    after = counts()
    h = some.has_value()
    v = some.get_value()
print("RESULT " + json.dumps({
    "variant": some._variant_tensor.device, "flags": flags, "backing": h.backing_device,
    "delta": {k: after[k] - before[k] for k in before}, "value_device": v.device,
    "value": v.numpy().tolist(),
}))
"""


def _run(tmp_path, script, direct, *args):
    path = tmp_path / "script.py"
    path.write_text(script)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TFWGPU_EAGER_OPS_DIRECT", None)
    if direct is not None:
        env["TFWGPU_EAGER_OPS_DIRECT"] = direct
    p = subprocess.run([sys.executable, str(path), *args], env=env, capture_output=True,
                       text=True, timeout=600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, (p.stdout[-2000:], p.stderr[-3000:])
    return json.loads(lines[-1][len("RESULT "):])


def test_has_value_of_a_gpu_optional_stays_on_the_host_with_the_switch(tmp_path):
    """`TFWGPU_EAGER_OPS_DIRECT=1`: the flag of an optional on the GPU is made and read on the
    host (no upload, device sync or read); without the switch (the default) TensorFlow's
    one-op function puts it on the device."""
    on = _run(tmp_path, _HAS_VALUE, "1")
    assert on["variant"].endswith("GPU:0"), on
    assert on["flags"] == [True, False], on
    assert on["backing"].endswith("CPU:0"), on
    assert on["delta"] == {"h2d": 0, "d2h": 0, "sync": 0}, on
    assert on["value_device"].endswith("GPU:0") and on["value"] == [2.0, 2.0, 2.0], on
    default = _run(tmp_path, _HAS_VALUE, None)
    assert default["flags"] == [True, False], default
    assert default["backing"].endswith("GPU:0"), default
    assert default["delta"]["h2d"] >= 2, default


_FIT = r"""
import json, os, sys
import numpy as np
import keras
import tensorflow as tf
import tensorflow_wgpu

dev = sys.argv[1]
keras.utils.set_random_seed(0)
x = np.random.default_rng(0).standard_normal((64, 1)).astype(np.float32)
y = (2.0 * x + 1.0).astype(np.float32)
with tf.device("/CPU:0"):
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()
with tf.device(dev):
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=False)
    model.fit(ds, steps_per_epoch=2, epochs=1, verbose=0)
    s0 = tensorflow_wgpu.stats()
    h = model.fit(ds, steps_per_epoch=8, epochs=3, verbose=0)
    s1 = tensorflow_wgpu.stats()
    with tf.device(dev):
        @tf.function
        def opt(v):
            return tf.experimental.Optional.from_value(v)
        hv = opt(tf.ones([2])).has_value()
print("RESULT " + json.dumps({
    "loss": [float(v) for v in h.history["loss"]],
    "weights": [w.tolist() for w in model.get_weights()],
    "h2d": s1["host_to_device"]["copies"] - s0["host_to_device"]["copies"],
    "sync": s1["stream_executor"]["synchronize_all_activity"]["calls"]
            - s0["stream_executor"]["synchronize_all_activity"]["calls"],
    "hv_backing": hv.backing_device,
}))
"""


def _fit(tmp_path, device, direct):
    return _run(tmp_path, _FIT, direct, device)


def test_keras_fit_same_results_with_and_without_and_fewer_copies(tmp_path):
    """Keras `fit` on GPU:0 with eager ops direct (`=1`) and as functions (`=0`): the same
    losses and weights (the same kernels run), TensorFlow's CPU device's within float32
    rounding; per step one host-to-device copy fewer (the flag) and one device sync fewer."""
    on = _fit(tmp_path, "/GPU:0", "1")
    off = _fit(tmp_path, "/GPU:0", "0")
    cpu = _fit(tmp_path, "/CPU:0", "0")
    assert on["loss"] == off["loss"] and on["weights"] == off["weights"], (on, off)
    # Dense(1) on 64 rows: float32 sums of 64 products, 24 SGD steps.
    np.testing.assert_allclose(on["loss"], cpu["loss"], rtol=1e-4)
    for a, b in zip(on["weights"], cpu["weights"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    steps = 24
    assert on["hv_backing"].endswith("CPU:0") and off["hv_backing"].endswith("GPU:0"), (on, off)
    # With eager ops as functions each step uploads the flag; its x and y uploads are the same.
    assert off["h2d"] - on["h2d"] == steps, (on, off)
    assert off["sync"] - on["sync"] >= steps, (on, off)


_THREADS = r"""
import json, sys, threading
import numpy as np
import tensorflow as tf

rounds = int(sys.argv[1])
shapes = [(3, 7), (5, 4, 6), (2, 9, 3), (8, 5)]
bad = []


def work(i):
    x = np.random.default_rng(i).standard_normal(shapes[i]).astype(np.float32)
    k, rest = x.shape[-1], [1] * (x.ndim - 1)
    cases = [
        (lambda: tf.reshape(tf.constant(x), [-1, k]), x.reshape(-1, k)),
        (lambda: tf.fill([k, 2], 1.5), np.full((k, 2), 1.5, np.float32)),
        (lambda: tf.tile(tf.constant(x), rest + [2]), np.tile(x, rest + [2])),
    ]
    try:
        for op, want in cases:
            for _ in range(rounds):
                with tf.device("/GPU:0"):
                    got = op().numpy()
                if got.shape != want.shape or not np.array_equal(got, want):
                    bad.append((i, "wrong values", got.shape))
    except Exception as e:  # noqa: BLE001 - an op handed another thread's shape raises
        bad.append((i, str(e)[:300]))


for _ in range(4):
    ts = [threading.Thread(target=work, args=(i,)) for i in range(len(shapes))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
print("RESULT " + json.dumps({"bad": bad[:5], "count": len(bad)}))
"""


def test_eager_ops_from_several_threads_with_the_switch(tmp_path):
    """Eager ops from four Python threads at once on GPU:0, each with its own shapes: with
    `TFWGPU_EAGER_OPS_DIRECT=1` every result is exact. (TensorFlow's default one-op functions
    pass a GPU op's host-memory arguments (a reshape's shape, fill's dims, tile's multiples)
    from a CPU partition through a rendezvous, which can hand one thread's values to another's
    op: 4 of 6 runs of this script failed without the switch here, and it is reported against
    TensorFlow on CUDA GPUs as well (tensorflow/tensorflow#62523, #123980).)"""
    out = _run(tmp_path, _THREADS, "1", "30")
    assert out["count"] == 0, out
