"""Recurrent layers on /GPU:0 through the fused recurrent op (CudnnRNNV3 and its gradient,
which Keras's LSTM and GRU call whenever TensorFlow lists a GPU), against Keras's generic loop
on /CPU:0: plain, stacked with initial states and returned sequences, backwards and
Bidirectional (ReverseSequence, a new kernel, checked against the CPU by itself), float16
(mixed precision), masked inputs (any mask: the hook packs the unmasked steps), `TFWGPU_FUSED_RNN=0`;
and a training step that reads the GPU back only for what Keras asks. The kernels' numerics against an
f64 reference and central differences: crates/runtime/tests/rnn.rs."""
import contextlib

import numpy as np
import pytest

import tensorflow_wgpu
from conftest import ran_on_gpu, same_error

FUSED = ("CudnnRNNV3", "CudnnRNNBackpropV3")


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "int64", "bool"])
@pytest.mark.parametrize("tlen", ["int32", "int64"])
def test_reverse_sequence_matches_cpu(tf, dtype, tlen):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 6, 3, 5)) * 10
    x = x.astype(dtype) if dtype != "bool" else x > 0
    cases = [
        (1, 0, [6, 0, 3, 1]),  # Keras's layout: sequences along axis 1, batch along 0
        (0, 1, [4, 2, 0, 1, 3, 4]),
        (2, 3, [3, 1, 0, 2, 3]),
        (3, 1, [5, 5, 5, 5, 5, 5]),
    ]
    for seq, batch, lens in cases:
        lens = np.array(lens, dtype=tlen)
        f = lambda v: tf.reverse_sequence(v, lens, seq_axis=seq, batch_axis=batch)  # noqa: E731
        with tf.device("/CPU:0"):
            want = f(tf.constant(x)).numpy()
        with tf.device("/GPU:0"), ran_on_gpu("ReverseSequence"):
            got = f(tf.constant(x)).numpy()
        np.testing.assert_array_equal(got, want, err_msg=f"{seq} {batch} {lens}")


def test_reverse_sequence_errors_match_cpu(tf):
    x = np.zeros((3, 4), np.float32)
    same_error(tf, lambda: tf.raw_ops.ReverseSequence(input=x, seq_lengths=[1, 2], seq_dim=1, batch_dim=0))
    same_error(tf, lambda: tf.raw_ops.ReverseSequence(input=x, seq_lengths=[1, 2, 3], seq_dim=1, batch_dim=1))
    same_error(tf, lambda: tf.raw_ops.ReverseSequence(input=x, seq_lengths=[1, 2, 3], seq_dim=2, batch_dim=0))
    same_error(tf, lambda: tf.raw_ops.ReverseSequence(input=x, seq_lengths=[1, 2, 3], seq_dim=1, batch_dim=2))
    same_error(tf, lambda: tf.raw_ops.ReverseSequence(input=x, seq_lengths=[[1, 2, 3]], seq_dim=1, batch_dim=0))


def _counts(tf):
    return dict(tensorflow_wgpu.stats()["gpu_ops"]), tensorflow_wgpu.stats()["runtime"]["reads"]


def _train(tf, keras, device, build, x, y, steps=3, **fit):
    """Losses of `steps` epochs of `fit` (batches of 16, Adam) of `build()` on `device`, and the
    weights after."""
    with tf.device(device):
        keras.utils.set_random_seed(4)
        m = build()
        m.compile(optimizer=keras.optimizers.Adam(0.01), loss=keras.losses.MeanSquaredError())
        h = m.fit(x, y, epochs=steps, batch_size=16, shuffle=False, verbose=0, **fit)
        return h.history["loss"], [w.numpy() for w in m.weights]


def _compare(tf, keras, build_gpu, build_cpu, x, y, fused=True, rtol=1e-4, atol=1e-5):
    before, _ = _counts(tf)
    got, w_got = _train(tf, keras, "/GPU:0", build_gpu, x, y)
    after, _ = _counts(tf)
    want, w_want = _train(tf, keras, "/CPU:0", build_cpu, x, y)
    ran = [after.get(op, 0) - before.get(op, 0) for op in FUSED]
    if fused:
        assert min(ran) > 0, ran
    else:
        assert max(ran) == 0, ran
    # float32 reassociation through the recurrence and three epochs of Adam.
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    for a, b in zip(w_got, w_want):
        np.testing.assert_allclose(a, b, rtol=50 * rtol, atol=50 * atol)


def _data(shape, out, seed=5):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.standard_normal((shape[0], out)).astype(np.float32)
    return x, y


@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
def test_stacked_layers_with_states_and_sequences(tf, layer):
    """Two layers, the first returning its sequences and given initial states; the GPU runs
    the fused op forward and backward, the CPU Keras's loop (`use_cudnn=False`)."""
    import keras

    x, y = _data((48, 9, 5), 3)
    states = 2 if layer == "LSTM" else 1

    def build(cudnn):
        def f():
            L = keras.layers
            i = keras.Input((9, 5))
            s0 = [L.Dense(12, activation="tanh")(L.Flatten()(i)) for _ in range(states)]
            h = getattr(L, layer)(12, return_sequences=True, use_cudnn=cudnn)(i, initial_state=s0)
            h = getattr(L, layer)(7, use_cudnn=cudnn)(h)
            return keras.Model(i, L.Dense(3)(h))

        return f

    _compare(tf, keras, build("auto"), build(False), x, y)


@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
def test_backwards_and_bidirectional(tf, layer):
    """`go_backwards` and Bidirectional: the fused op between two ReverseSequence on the GPU."""
    import keras

    x, y = _data((32, 7, 4), 2, seed=6)

    def build(cudnn):
        def f():
            L = keras.layers
            rnn = lambda n, **k: getattr(L, layer)(n, use_cudnn=cudnn, **k)  # noqa: E731
            return keras.Sequential(
                [keras.Input((7, 4)), L.Bidirectional(rnn(6, return_sequences=True)), rnn(5, go_backwards=True), L.Dense(2)]
            )

        return f

    with ran_on_gpu("ReverseSequence"):
        _compare(tf, keras, build("auto"), build(False), x, y)


def _masks(b, t, seed):
    """Masks of every shape the generic loop takes: fully masked, unmasked, left- and
    right-padded, holes."""
    rng = np.random.default_rng(seed)
    m = rng.random((b, t)) > 0.4
    m[0], m[1] = False, True
    m[2, :3] = False
    m[3, 4:] = False
    m[4, :] = [k % 2 == 1 for k in range(t)]
    return m


@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
@pytest.mark.parametrize("sequences", [False, True])
@pytest.mark.parametrize("backwards", [False, True])
@pytest.mark.parametrize("zeros", [False, True])
def test_masked_inputs_take_the_fused_op(tf, layer, sequences, backwards, zeros):
    """Any mask (the loop skips masked steps: states kept, the previous output or zeros with
    `zero_output_for_mask`): the hook moves each sequence's unmasked steps to its front, runs
    the fused op on them as a right-padded sequence, and moves the outputs back. Outputs, final
    states and every gradient are the CPU loop's, for initial states that are not zeros (a
    fully masked sequence keeps them, and outputs zeros)."""
    import keras

    b, t, f, h = 7, 8, 3, 5
    rng = np.random.default_rng(3)
    x = rng.standard_normal((b, t, f)).astype(np.float32)
    s0 = rng.standard_normal((2, b, h)).astype(np.float32)
    mask = _masks(b, t, seed=4)
    outs = {}
    for device, cudnn in [("/GPU:0", "auto"), ("/CPU:0", False)]:
        with tf.device(device):
            keras.utils.set_random_seed(1)
            rnn = getattr(keras.layers, layer)(
                h, return_sequences=sequences, return_state=True, go_backwards=backwards, use_cudnn=cudnn
            )
            rnn.zero_output_for_mask = zeros
            xt = tf.constant(x)
            states = [tf.constant(s) for s in s0[: 2 if layer == "LSTM" else 1]]
            with ran_on_gpu(*FUSED) if cudnn == "auto" else contextlib.nullcontext(), tf.GradientTape() as tape:
                tape.watch([xt] + states)
                got = rnn(xt, mask=tf.constant(mask), initial_state=states)
                # Weighted so that each output's gradient differs.
                loss = sum(tf.reduce_sum(v * (k + 1.5)) for k, v in enumerate(got))
                grads = tape.gradient(loss, [xt] + states + rnn.trainable_weights)
            outs[device] = [v.numpy() for v in list(got) + grads]
    for k, (g, w) in enumerate(zip(outs["/GPU:0"], outs["/CPU:0"])):
        # float32 reassociation over at most 8 steps.
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6, err_msg=str(k))


@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
def test_masked_training_matches_the_loop(tf, layer):
    """`fit` of Masking -> Bidirectional(layer, sequences) -> layer on left-padded, right-padded
    and holed sequences: the fused op forward and backward, the CPU loop's losses and weights."""
    import keras

    x, y = _data((32, 8, 3), 2, seed=7)
    x[::3, 5:] = 0.0
    x[1::5, :2] = 0.0
    x[2::7, 3] = 0.0
    x[5] = 0.0

    def build(cudnn):
        def f():
            L = keras.layers
            rnn = lambda n, **k: getattr(L, layer)(n, use_cudnn=cudnn, **k)  # noqa: E731
            return keras.Sequential(
                [keras.Input((8, 3)), L.Masking(0.0), L.Bidirectional(rnn(6, return_sequences=True)), rnn(5), L.Dense(2)]
            )

        return f

    _compare(tf, keras, build("auto"), build(False), x, y)


def test_embedding_mask_on_left_padded_tokens(tf):
    """Keras's text recipe: `pad_sequences` pads on the left by default, `Embedding(mask_zero)`
    masks the padding; timesteps unknown to the graph (`Input((None,))`). The fused op runs,
    with the CPU loop's losses and weights (an explicit `use_cudnn=True` on the GPU)."""
    import keras

    rng = np.random.default_rng(13)
    lengths = rng.integers(0, 10, 48)
    x = np.zeros((48, 10), np.int32)
    for k, n in enumerate(lengths):
        x[k, 10 - n :] = rng.integers(1, 30, n)
    y = rng.standard_normal((48, 2)).astype(np.float32)

    def build(cudnn):
        def f():
            L = keras.layers
            return keras.Sequential(
                [keras.Input((None,), dtype="int32"), L.Embedding(30, 4, mask_zero=True), L.GRU(6, use_cudnn=cudnn), L.Dense(2)]
            )

        return f

    _compare(tf, keras, build(True), build(False), x, y)


def test_switched_off_keeps_the_loop_and_refuses_cudnn(tf, monkeypatch):
    import keras

    monkeypatch.setenv("TFWGPU_FUSED_RNN", "0")
    x, y = _data((32, 6, 3), 2, seed=8)

    def build():
        return keras.Sequential([keras.Input((6, 3)), keras.layers.GRU(5), keras.layers.Dense(2)])

    _compare(tf, keras, build, build, x, y, fused=False)
    with tf.device("/GPU:0"):
        forced = keras.Sequential([keras.Input((6, 3)), keras.layers.GRU(4, use_cudnn=True)])
        with pytest.raises(ValueError, match="cuDNN is not supported"):
            forced(x[:2])


@pytest.mark.parametrize("masked", [False, True])
def test_mixed_precision(tf, masked):
    """float16 activations (Keras's mixed_float16): the op converts to float32 inside and rounds
    its outputs once; the CPU's loop rounds every op's result to float16, so the two differ by
    float16 rounding (~1e-3 relative) compounded over the steps. Masked: the packed steps and
    the held outputs of a returned sequence in float16."""
    import keras

    x, y = _data((32, 6, 4), 2, seed=9)
    if masked:
        x[::3, :2] = 0.0
        x[1::4, 4:] = 0.0
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:

        def build(cudnn):
            def f():
                L = keras.layers
                first = [L.Masking(0.0), L.GRU(6, return_sequences=True, use_cudnn=cudnn)] if masked else []
                return keras.Sequential(
                    [keras.Input((6, 4))] + first + [L.LSTM(8, use_cudnn=cudnn), L.Dense(2, dtype="float32")]
                )

            return f

        before, _ = _counts(tf)
        got, _ = _train(tf, keras, "/GPU:0", build("auto"), x, y)
        after, _ = _counts(tf)
        want, _ = _train(tf, keras, "/CPU:0", build(False), x, y)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert all(after.get(op, 0) > before.get(op, 0) for op in FUSED)
    np.testing.assert_allclose(got, want, rtol=2e-2)


@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
@pytest.mark.parametrize("masked", [False, True, "float16"])
def test_fused_training_step_reads_nothing_mid_step(tf, layer, masked):
    """A training step of a recurrent layer over 20 timesteps (batch unknown to the graph) runs
    two kernels for the layer and reads nothing back, masked (left-padded and holed sequences;
    also under mixed precision, where a select's gradient summed in float16 on the CPU once) or
    not; loss and gradients are the CPU loop's."""
    import keras

    if masked == "float16":
        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            return test_fused_training_step_reads_nothing_mid_step(tf, layer, "mixed")
        finally:
            keras.mixed_precision.set_global_policy("float32")

    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 20, 3)).astype(np.float32)
    y = rng.standard_normal((4, 5)).astype(np.float32)
    if masked:
        x[0, :7] = 0.0
        x[1, 3:5] = 0.0
        x[2, 12:] = 0.0
    results = {}
    for device, cudnn in [("/CPU:0", False), ("/GPU:0", "auto")]:
        with tf.device(device):
            keras.utils.set_random_seed(3)
            layers = [keras.layers.Masking(0.0)] if masked else []
            layers.append(getattr(keras.layers, layer)(5, use_cudnn=cudnn))
            m = keras.Sequential([keras.Input((20, 3))] + layers)

            @tf.function(input_signature=[tf.TensorSpec([None, 20, 3]), tf.TensorSpec([None, 5])])
            def step(xb, yb):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(tf.cast(m(xb, training=True), tf.float32) - yb))
                return loss, tape.gradient(loss, m.trainable_weights)

            xd, yd = tf.identity(tf.constant(x)), tf.identity(tf.constant(y))
            step(xd, yd)
            before, reads = _counts(tf)
            loss, grads = step(xd, yd)
            after, reads_after = _counts(tf)
            results[device] = (loss.numpy(), [g.numpy() for g in grads], reads_after - reads, before, after)
    loss, grads, reads, before, after = results["/GPU:0"]
    assert reads == 0, reads
    ran = {op: after.get(op, 0) - before.get(op, 0) for op in after}
    assert [ran.get(op, 0) for op in FUSED] == [1, 1], ran
    # The flat weights from one transpose per kernel (the hook's `_whole_params`), and their
    # gradient cut in three: Keras's per-gate pieces took 16 transposes and 17 slices.
    assert ran.get("Transpose", 0) <= 4 and ran.get("Slice", 0) <= 4 and ran.get("Split", 0) == 0, ran
    want_loss, want_grads, *_ = results["/CPU:0"]
    # float16: the CPU loop rounds every op to float16 (see test_mixed_precision).
    rtol, atol = (2e-2, 2e-3) if masked == "mixed" else (1e-5, 1e-6)
    np.testing.assert_allclose(loss, want_loss, rtol=rtol)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=10 * rtol, atol=atol)


@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
def test_eager_calls(tf, layer):
    """A layer called eagerly (no graph: Keras builds the flat weights from its per-gate pieces)
    runs the fused op on the GPU with the CPU loop's outputs and state."""
    import keras

    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 7, 3)).astype(np.float32)
    outs = {}
    for device, cudnn in [("/GPU:0", "auto"), ("/CPU:0", False)]:
        with tf.device(device):
            keras.utils.set_random_seed(12)
            rnn = getattr(keras.layers, layer)(6, return_sequences=True, return_state=True, use_cudnn=cudnn)
            with ran_on_gpu("CudnnRNNV3") if cudnn == "auto" else contextlib.nullcontext():
                outs[device] = [t.numpy() for t in rnn(tf.constant(x))]
    for g, w in zip(outs["/GPU:0"], outs["/CPU:0"]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)



def test_empty_sequences_through_tensorflow(tf):
    """Zero timesteps: the final states are the initial ones (TensorFlow gives empty outputs
    host addresses, which the kernel must not bind), for every cell."""
    h0 = np.arange(8, dtype=np.float32).reshape(1, 2, 4) / 8
    for mode, gates in [("lstm", 4), ("gru", 3), ("rnn_tanh", 1)]:
        with tf.device("/GPU:0"), ran_on_gpu("CudnnRNNV3"):
            out = tf.raw_ops.CudnnRNNV3(
                input=tf.zeros([0, 2, 3]), input_h=h0, input_c=h0 + 1 if mode == "lstm" else 0.0,
                params=tf.ones([gates * 4 * (3 + 4 + 2)]), sequence_lengths=tf.zeros([2], tf.int32),
                rnn_mode=mode,
            )
        assert out[0].shape == (0, 2, 4)
        np.testing.assert_array_equal(out[1].numpy(), h0)
        if mode == "lstm":
            np.testing.assert_array_equal(out[2].numpy(), h0 + 1)
