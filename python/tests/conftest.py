"""Shared fixtures: TensorFlow with the tfwgpu plugin loaded, and GPU:0 present."""
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="session")
def tf():
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    assert gpus, "the tfwgpu plugin did not register a GPU (is tensorflow-wgpu installed?)"
    return tf


def on_gpu(t):
    return t.device.endswith("GPU:0")


def gpu_counts():
    """The plugin's GPU kernel runs per op since the process started."""
    import tensorflow_wgpu

    return tensorflow_wgpu.stats()["gpu_ops"]


class ran_on_gpu:
    """Asserts that each named op ran at least once on the GPU inside the block."""

    def __init__(self, *ops):
        self.ops = ops

    def __enter__(self):
        self.before = gpu_counts()

    def __exit__(self, *exc):
        if exc[0] is None:
            after = gpu_counts()
            for op in self.ops:
                assert after.get(op, 0) > self.before.get(op, 0), f"{op} did not run on the GPU"


class ran_on_host:
    """Asserts that each named op ran at least once inside the block as one of the runtime's
    host kernels on GPU:0 (int32 shape arithmetic kept in host memory, as on CUDA)."""

    def __init__(self, *ops):
        self.ops = ops

    def _counts(self):
        import tensorflow_wgpu

        return tensorflow_wgpu.stats()["host_ops"]

    def __enter__(self):
        self.before = self._counts()

    def __exit__(self, *exc):
        if exc[0] is None:
            after = self._counts()
            for op in self.ops:
                assert after.get(op, 0) > self.before.get(op, 0), f"{op} did not run on the host"


def same_error(tf, call):
    """Runs `call()` under /GPU:0 and /CPU:0: both raise InvalidArgumentError, and the GPU's
    message holds the CPU's text (after TensorFlow's function-node prefix and before its op
    suffix; the plugin's message may name the op first)."""
    import pytest

    msgs = {}
    for dev in ["/GPU:0", "/CPU:0"]:
        with tf.device(dev):
            with pytest.raises(tf.errors.InvalidArgumentError) as e:
                call()
            msgs[dev] = e.value.message
    want = msgs["/CPU:0"].split("}} ", 1)[-1].split(" [Op:")[0]
    assert want in msgs["/GPU:0"], msgs
