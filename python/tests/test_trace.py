"""Kernel trace capture (TFWGPU_TRACE) on a small Keras fit, and its replay with
`tfwgpu-bench replay`."""
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

PROG = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow as tf
    # One op at a time on the device: each kernel record's dispatch count is then exact.
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 20)).astype("float32")
    y = ((x[:, 0] > 0).astype("int32") + (x[:, 1] > 1).astype("int32"))
    with tf.device("/GPU:0"):
        model = keras.Sequential([
            keras.Input((20,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(3, activation="softmax"),
        ])
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                      loss="sparse_categorical_crossentropy")
        h = model.fit(x, y, epochs=2, batch_size=16, shuffle=False, verbose=0)
    np.savez(sys.argv[1], loss=np.array(h.history["loss"]),
             *[w.numpy() for w in model.weights])
    """
)


def _run(tmp_path, name, trace=None):
    script = tmp_path / "fit.py"
    script.write_text(PROG)
    out = tmp_path / f"{name}.npz"
    env = dict(os.environ)
    env.pop("TFWGPU_TRACE", None)
    if trace is not None:
        env["TFWGPU_TRACE"] = str(trace)
    r = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return np.load(out)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trace")
    path = tmp / "fit.trace"
    traced = _run(tmp, "traced", path)
    plain = _run(tmp, "plain")
    return path, traced, plain


def _records(path):
    lines = pathlib.Path(path).read_text().splitlines()
    return [json.loads(l) for l in lines]


def test_tracing_changes_no_result(traced):
    _, a, b = traced
    assert set(a.files) == set(b.files) and len(a.files) >= 5
    for k in a.files:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_trace_has_kernels_with_shapes_and_addresses(traced):
    path, _, _ = traced
    recs = _records(path)
    assert recs[0] == {"ev": "header", "format": "tfwgpu-trace", "version": 1}
    seqs = [r["seq"] for r in recs[1:]]
    assert seqs == list(range(len(seqs))), "events are numbered in file order"
    kinds = {r["ev"] for r in recs[1:]}
    assert {"alloc", "h2d", "d2h", "kernel"} <= kinds, kinds
    kernels = [r for r in recs if r["ev"] == "kernel"]
    ops = {k["op"] for k in kernels}
    # The dense layers' forward and backward passes, the optimizer's update (BiasAdd + Relu
    # may run as one fused kernel: the plugin's elementwise fusion).
    assert {"MatMul", "BiasAddGrad"} <= ops, ops
    fused = {"_TfwgpuFusedElementwise", "_TfwgpuFusedElementwiseMulti"}
    assert ops & ({"Relu"} | fused) and ops & ({"BiasAdd"} | fused), ops
    allocs = [(r["addr"], r["size"]) for r in recs if r["ev"] == "alloc"]
    assert allocs and all(s > 0 for _, s in allocs)
    for k in kernels:
        assert k["outputs"], k
        for t in k["inputs"] + k["outputs"]:
            assert isinstance(t["shape"], list) and isinstance(t["dtype"], str)
            assert "addr" in t or "host" in t
    mm = next(k for k in kernels if k["op"] == "MatMul" and k["inputs"][1]["shape"] == [20, 16])
    assert mm["inputs"][0]["shape"][1] == 20 and mm["outputs"][0]["shape"][1] == 16
    assert mm["attrs"]["transpose_a"] == {"b": False} and mm["attrs"]["T"] == {"type": "float32"}
    assert mm["dispatches"] >= 1
    # Every device address lies inside an allocation made before it was used.
    live = []
    for r in recs[1:]:
        if r["ev"] == "alloc":
            live.append((r["addr"], r["size"]))
        elif r["ev"] == "free":
            live = [x for x in live if x[0] != r["addr"]]
        elif r["ev"] == "kernel":
            for t in r["inputs"] + r["outputs"]:
                if "addr" in t and np.prod(t["shape"]) > 0:
                    assert any(a <= t["addr"] < a + s for a, s in live), (r["op"], t)
    # The dataflow: some kernel reads what an earlier kernel wrote, at the same address.
    written = set()
    reused = 0
    for k in kernels:
        reused += any(t.get("addr") in written for t in k["inputs"])
        written.update(t["addr"] for t in k["outputs"])
    assert reused > len(kernels) // 4


def _bench():
    target = os.environ.get("CARGO_TARGET_DIR") or str(
        pathlib.Path(__file__).resolve().parents[2] / "target")
    exe = pathlib.Path(os.environ.get("TFWGPU_BENCH", pathlib.Path(target) / "debug" / "tfwgpu-bench"))
    if not exe.exists():
        pytest.fail(f"{exe} not built: cargo build -p tfwgpu-bench (or set TFWGPU_BENCH)")
    return exe


def test_replay_dispatches_what_the_trace_recorded(traced, tmp_path):
    path, _, _ = traced
    out = tmp_path / "replay.json"
    r = subprocess.run([str(_bench()), "replay", str(path), "--repeat", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(out.read_text())
    kernels = [k for k in _records(path) if k.get("ev") == "kernel"]
    assert d["traced_kernels"] == len(kernels) == d["kernels"]
    want = sum(k["dispatches"] for k in kernels)
    assert want > 0
    assert d["kernel_dispatches"] == want == d["traced_dispatches"]
    assert d["dispatch_mismatches"] == 0 and d["shape_mismatches"] == 0
    assert d["dispatches"] >= want and d["submits"] >= 1
    assert d["host_syncs"] >= sum(1 for k in _records(path) if k.get("ev") == "d2h")
    assert d["per_op"]["MatMul"]["calls"] == sum(k["op"] == "MatMul" for k in kernels)
    assert len(d["wall_ms"]) == 2 and "MatMul" in r.stdout
