"""bench/keras_models.py's trace capture: step marks (tensorflow_wgpu.trace_mark) in a kernel
trace of a small Keras fit, and their per-step split in `tfwgpu-bench replay`."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "keras_models.py"


def _bench():
    target = os.environ.get("CARGO_TARGET_DIR") or str(ROOT / "target")
    exe = pathlib.Path(os.environ.get("TFWGPU_BENCH", pathlib.Path(target) / "debug" / "tfwgpu-bench"))
    if not exe.exists():
        pytest.fail(f"{exe} not built: cargo build -p tfwgpu-bench (or set TFWGPU_BENCH)")
    return exe


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kmodels")
    out = tmp / "capture.json"
    env = dict(os.environ)
    env.pop("TFWGPU_TRACE", None)
    r = subprocess.run([sys.executable, str(SCRIPT), "--models", "mlp", "--batch", "8", "--trace", str(tmp),
                        "--trace-steps", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return tmp / "mlp.trace", json.loads(out.read_text())


def _records(path):
    return [json.loads(l) for l in pathlib.Path(path).read_text().splitlines()]


def test_marks_frame_the_steps(captured):
    path, doc = captured
    assert doc["mlp"]["lines"] > 10 and path.exists()
    recs = _records(path)
    marks = [r["label"] for r in recs if r.get("ev") == "mark"]
    assert marks == ["setup", "warmup_train", "train_step", "train_step_end", "train_step", "train_step_end",
                     "after_train", "warmup_infer", "infer_step", "infer_step", "after_infer"]
    assert all(r["dev"] == -1 for r in recs if r.get("ev") == "mark")
    # Each interval opened by a step mark holds that step's kernels.
    idx = [i for i, r in enumerate(recs) if r.get("ev") == "mark"]
    ops_between = [{r["op"] for r in recs[a:b] if r.get("ev") == "kernel"} for a, b in zip(idx, idx[1:])]
    for label, ops in zip(marks, ops_between):
        # BiasAdd + Relu of a hidden Dense layer run as one fused kernel (the plugin's
        # elementwise fusion; TFWGPU_FUSION=0 turns it off).
        fused_relu = ops & {"Relu", "_TfwgpuFusedElementwise", "_TfwgpuFusedElementwiseMulti"}
        # The output layer's MatMul and BiasAdd run as one kernel call (the plugin's bias
        # epilogue; TFWGPU_BIAS_EPILOGUE=0 keeps two).
        bias = ops & {"BiasAdd", "_TfwgpuMatMulBiasAdd"}
        if label == "train_step":
            # forward, backward and Adam's update
            assert {"MatMul", "BiasAddGrad"} <= ops and bias and fused_relu, ops
        if label == "infer_step":
            assert "MatMul" in ops and bias and fused_relu and "BiasAddGrad" not in ops, ops
    # The two training steps run the same kernels (TensorFlow's executor may order them
    # differently).
    steps = [[(r["op"], json.dumps(r["attrs"], sort_keys=True)) for r in recs[a:b] if r.get("ev") == "kernel"]
             for (a, b), label in zip(zip(idx, idx[1:]), marks) if label == "train_step"]
    assert len(steps) == 2 and sorted(steps[0]) == sorted(steps[1]) and steps[0]


def test_replay_reports_the_marked_steps(captured, tmp_path):
    path, _ = captured
    out = tmp_path / "replay.json"
    r = subprocess.run([str(_bench()), "replay", str(path), "--repeat", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(out.read_text())
    assert d["dispatch_mismatches"] == 0 and d["shape_mismatches"] == 0
    steps = d["steps"]
    # The second pass's intervals (the first compiles pipelines): two per step label.
    assert steps["train_step"]["steps"] == 2 and steps["infer_step"]["steps"] == 2
    assert "after_infer" not in steps, "the last mark opens no interval"
    for label in ("train_step", "infer_step"):
        assert 0 < steps[label]["median_ms"] < d["wall_median_ms"]
    assert 'steps "train_step"' in r.stdout


def test_trace_mark_is_off_without_a_trace():
    env = dict(os.environ)
    env.pop("TFWGPU_TRACE", None)
    r = subprocess.run([sys.executable, "-c", "import tensorflow, tensorflow_wgpu as t; print(t.trace_mark('x'))"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "False"
