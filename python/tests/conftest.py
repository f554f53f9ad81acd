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
