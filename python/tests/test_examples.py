"""Every script in examples/ runs unchanged, on GPU:0."""
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def run(name):
    r = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_tensors():
    out = run("tensors.py")
    assert "ran on /job:localhost/replica:0/task:0/device:GPU:0" in out
    diff = float(re.search(r"max difference to the CPU: (\S+)", out).group(1))
    assert diff < 1e-5


def test_keras_mlp():
    out = run("keras_mlp.py")
    assert "weights on /job:localhost/replica:0/task:0/device:GPU:0" in out
    assert float(re.search(r"final accuracy (\S+)", out).group(1)) > 0.9


@pytest.mark.parametrize("name", ["custom_loop.py"])
def test_custom_loop(name):
    out = run(name)
    assert "device:GPU:0" in out
    assert float(re.search(r"loss (\S+)", out).group(1)) < 1e-4
