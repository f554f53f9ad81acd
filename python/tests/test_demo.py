"""The demo: a short real run, and clear failures."""
import os
import subprocess
import sys


def demo(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "tensorflow_wgpu.demo", *args],
        capture_output=True, text=True, timeout=900, env=env,
    )


def test_short_run_prints_adapter_accuracy_and_throughput():
    r = demo("--limit", "512", "--epochs", "1", "--batch-size", "64")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("adapter: ")
    assert "training on 512 of 60000 images for 1 epochs" in r.stdout
    row = [l for l in r.stdout.splitlines() if l.startswith("/GPU:0")]
    assert row, r.stdout
    acc, train_ips, infer_ips = (float(v) for v in row[0].split()[1:4])
    assert 0.3 < acc <= 1.0 and train_ips > 0 and infer_ips > 0


def test_missing_dataset_is_a_clear_error():
    r = demo("--data-dir", "/nonexistent")
    assert r.returncode == 2
    assert "dataset-fashion-mnist" in r.stderr


def test_no_adapter_is_a_clear_error():
    env = dict(os.environ, TFWGPU_ADAPTER="no-such-adapter")
    r = demo("--limit", "64", "--epochs", "1", env=env)
    assert r.returncode == 3
    assert "no tfwgpu GPU is available" in r.stderr
