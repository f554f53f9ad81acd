"""The three reference models (tensorflow_wgpu.models) on a slice of real Fashion-MNIST:
trained with plain compile + fit and with a GradientTape loop on GPU:0 against CPU:0, predict
and evaluate, save on GPU / load on CPU and back, and zero CPU fallbacks in the training step.

Tolerances. The first step's loss is a forward pass with the same weights and data: it
differs only by float32 summation order in convolutions, matmuls and reductions (relative
error about sqrt(K) * 6e-8 per layer with K <= 800), so 1e-4 relative. After that the two
runs drift apart through the optimizer (Adam divides by sqrt(v), which amplifies tiny gradient
differences), so later steps are only asked to stay close (2e-2 relative over a few steps) and
to train (loss falls on both devices).
"""
import json
import subprocess
import sys

import numpy as np
import pytest

from tensorflow_wgpu import models

STEPS = 4
BATCH = 32


@pytest.fixture(scope="module")
def keras(tf):
    import keras

    return keras


@pytest.fixture(scope="module")
def xy():
    return models.data(STEPS * BATCH)


def close_losses(gpu, cpu, what):
    gpu, cpu = np.array(gpu), np.array(cpu)
    assert gpu.shape == cpu.shape and len(gpu) == STEPS, what
    assert np.all(np.isfinite(gpu)), (what, gpu)
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-4, err_msg=f"{what}: first step")
    np.testing.assert_allclose(gpu, cpu, rtol=2e-2, err_msg=f"{what}: later steps")


@pytest.mark.parametrize("name", models.MODELS)
def test_gradient_tape_loop_tracks_cpu(tf, keras, xy, name):
    x, y = xy
    _, g = models.train_loop(tf, keras, name, x, y, "/GPU:0", STEPS, BATCH)
    _, c = models.train_loop(tf, keras, name, x, y, "/CPU:0", STEPS, BATCH)
    close_losses(g, c, f"{name} loop")


@pytest.mark.parametrize("name", models.MODELS)
def test_fit_predict_evaluate_save_load(tf, keras, xy, name, tmp_path):
    x, y = xy
    gm, g = models.train_fit(tf, keras, name, x, y, "/GPU:0", batch_size=BATCH)
    cm, c = models.train_fit(tf, keras, name, x, y, "/CPU:0", batch_size=BATCH)
    close_losses(g, c, f"{name} fit")
    # The weights live on the GPU and predict/evaluate run there.
    assert all(v.value.device.endswith("GPU:0") for v in gm.weights), name
    with tf.device("/GPU:0"):
        pg = gm.predict(x, batch_size=BATCH, verbose=0)
        loss_g, acc_g = gm.evaluate(x, y, batch_size=BATCH, verbose=0)
    with tf.device("/CPU:0"):
        pc = gm.predict(x, batch_size=BATCH, verbose=0)
    # Same weights, same inputs, two devices: a forward pass apart.
    np.testing.assert_allclose(pg, pc, rtol=1e-4, atol=1e-5)
    assert np.isfinite(loss_g) and 0.0 <= acc_g <= 1.0
    # Saved on the GPU, loaded on the CPU and back: the same predictions.
    path = str(tmp_path / f"{name}.keras")
    gm.save(path)
    with tf.device("/CPU:0"):
        lc = keras.models.load_model(path)
        pl = lc.predict(x, batch_size=BATCH, verbose=0)
    np.testing.assert_allclose(pl, pc, rtol=1e-6, atol=1e-7)
    with tf.device("/GPU:0"):
        lg = keras.models.load_model(path)
        assert all(v.value.device.endswith("GPU:0") for v in lg.weights)
        plg = lg.predict(x, batch_size=BATCH, verbose=0)
    np.testing.assert_allclose(plg, pg, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", models.MODELS)
@pytest.mark.parametrize("mode", ["fit", "loop"])
def test_training_step_has_no_cpu_fallbacks(tmp_path, name, mode):
    out = tmp_path / "report.json"
    r = subprocess.run(
        [sys.executable, "-m", "tensorflow_wgpu.report", "--json", str(out), "-m", "tensorflow_wgpu.models",
         "--model", name, "--mode", mode, "--steps", "2", "--batch-size", "16"],
        capture_output=True, text=True, timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step 1 loss" in r.stdout
    d = json.loads(out.read_text())
    assert d["fallbacks"] == {}, f"{name} {mode}: ops fell back to the CPU: {d['fallbacks']}"
    assert d["ops"]["MatMul"]["gpu_kernel_runs"] > 0
