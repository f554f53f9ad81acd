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
