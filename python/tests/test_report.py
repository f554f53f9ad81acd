"""The fallback report on a small program: GPU kernel runs, CPU fallbacks, copies."""
import json
import subprocess
import sys
import textwrap


def test_report_names_gpu_ops_fallbacks_and_copies(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent(
            """
            import tensorflow as tf
            with tf.device("/GPU:0"):
                x = tf.ones([4, 4])
                y = tf.matmul(x, x)
                n = tf.strings.length(tf.strings.as_string(y))  # "4.000000": no GPU kernel, CPU fallback
                z = tf.cast(n, tf.float32) + y
            print("program output", float(tf.reduce_sum(z)))
            """
        )
    )
    out = tmp_path / "report.json"
    r = subprocess.run(
        [sys.executable, "-m", "tensorflow_wgpu.report", "--json", str(out), str(script)],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    # The program's own output passes through; the placement log does not.
    assert "program output 192.0" in r.stdout, r.stdout
    assert "(MatMul):" not in r.stdout
    assert "tfwgpu fallback report" in r.stderr
    d = json.loads(out.read_text())
    assert d["ops"]["MatMul"]["gpu_kernel_runs"] == 1
    assert d["ops"]["MatMul"].get("eager:GPU:0") == 1
    assert "StringLength" in d["fallbacks"] and "AsString" in d["fallbacks"]
    assert "MatMul" not in d["fallbacks"]
    # The fallback read the matmul result back to the host.
    assert d["device_to_host"]["copies"] >= 1 and d["device_to_host"]["bytes"] >= 64


def test_report_tells_program_placed_cpu_work_from_fallbacks(tmp_path):
    """Work the program puts on the CPU itself (an explicit CPU scope, a tf.data function, a
    whole function placed on the CPU) is listed but is no fallback; a CPU node inside a graph
    that runs on the GPU is."""
    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent(
            """
            import tensorflow as tf
            ds = tf.data.Dataset.range(8).map(lambda v: v * 3).shuffle(4)

            @tf.function
            def step(x):
                s = tf.strings.length(tf.strings.as_string(x))  # no GPU kernel: a fallback
                return tf.nn.relu(x) * 2.0 + tf.cast(s, tf.float32)

            with tf.device("/GPU:0"):
                for _ in ds.take(2):
                    pass
                g = step(tf.ones([2, 2]))
            with tf.device("/CPU:0"):
                a = tf.strings.as_string(tf.ones([2]))  # asked for the CPU: no fallback
                c = step(tf.ones([3, 2]))  # a whole graph on the CPU
            print("ok", float(tf.reduce_sum(g)), float(tf.reduce_sum(c)))
            """
        )
    )
    out = tmp_path / "report.json"
    r = subprocess.run(
        [sys.executable, "-m", "tensorflow_wgpu.report", "--json", str(out), str(script)],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ok 40.0 60.0" in r.stdout, r.stdout
    d = json.loads(out.read_text())
    fb = d["fallbacks"]
    # In the GPU graph: the string ops fell back, once each.
    assert fb.get("StringLength") == 1 and fb.get("AsString") == 1, fb
    # The CPU graph's copy of the same ops, the eager op in the CPU scope, tf.data: not counted.
    assert d["ops"]["StringLength"].get("host_graph") == 1
    assert d["ops"]["AsString"].get("eager_user_cpu") == 1
    assert d["ops"]["Relu"].get("host_graph") == 1 and "Relu" not in fb
    assert not any("Dataset" in op or "SeedGenerator" in op for op in fb), fb
    assert "Mul" not in fb and "MapDataset" not in fb


def test_tf_data_ops_are_host_work_by_design():
    from tensorflow_wgpu.report import host_by_design

    # tf.data ops Keras runs on a dataset (DatasetCardinality when fit gets a tf.data.Dataset)
    # have no device kernels anywhere: never fallbacks.
    for op in ["DatasetCardinality", "ShuffleDatasetV3", "TensorSliceDataset", "IteratorGetNext",
               "AnonymousIteratorV3", "DeleteIterator", "MakeIterator", "OptionalFromValue",
               "AnonymousSeedGenerator"]:
        assert host_by_design(op), op
    for op in ["MatMul", "Conv2D", "AddV2", "Cast", "ResourceApplyAdam"]:
        assert not host_by_design(op), op


def test_report_runs_programs_whose_graphs_have_loops(tmp_path):
    """Graphs built inside control flow (Keras's generic LSTM loop, `use_cudnn=False`) hand the
    report's op callback their op types as bytes; the program ran to its end under the report
    (it failed with a TypeError before)."""
    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent(
            """
            import numpy as np, keras
            m = keras.Sequential([keras.Input((5, 4)), keras.layers.Masking(0.0), keras.layers.LSTM(3, use_cudnn=False)])
            print("program output", m(np.ones((2, 5, 4), "float32")).shape)
            """
        )
    )
    r = subprocess.run(
        [sys.executable, "-m", "tensorflow_wgpu.report", str(script)],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "program output (2, 3)" in r.stdout, r.stdout
