"""Small fixes applied to TensorFlow and Keras in every process, by `tensorflow_wgpu.pth`.

Each waits for the module it fixes to be imported (importing this module imports nothing
else), and each changes behaviour only for tfwgpu devices:

- Keras 3 resolves `jit_compile="auto"` to True as soon as TensorFlow lists a non-CPU device
  (only Apple GPUs are exempted), and `fit` then fails: XLA has no compiler for a
  PluggableDevice. When every accelerator is a tfwgpu device, "auto" means no XLA; an explicit
  `jit_compile=True` is left alone.
- Keras 3's LSTM and GRU layers (`use_cudnn="auto"`) take the fused recurrent op
  (`CudnnRNNV3`) whenever TensorFlow lists a GPU; the plugin implements it (one layer,
  unidirectional: what Keras asks for), so on tfwgpu GPUs a layer runs one forward and one
  backward kernel per step instead of a `while` loop of ~30 kernels per timestep. Masked inputs
  take it too, with any mask: each sequence's unmasked steps are moved to its front, the op runs
  them as right-padded sequences, and the outputs are moved back (`_masked_fused`), which gives
  the generic loop's results (Keras's own fused path asserts right-padding instead, a read of
  the GPU each call, and fails on other masks). TensorFlow builds with CUDA or ROCm keep
  Keras's own rule (Keras then reorders the gates for cuDNN or MIOpen, not the orders the
  plugin's kernel takes). `TFWGPU_FUSED_RNN=0` keeps the generic loop
  everywhere; an explicit `use_cudnn=True` then fails too. Inside graphs, the op's flat weights are
  built from one transpose per kernel (`_whole_params`) rather than Keras's per-gate pieces.
- Keras 3 compiles grouped convolutions and channels-first 3-D convolutions with XLA
  (`jit_compile=True`: TensorFlow's CPU kernels lack them), and XLA has no compiler for a
  PluggableDevice. When every accelerator is a tfwgpu device and the ops are not placed on the
  CPU, grouped and channels-first convolutions run as plain `tf.nn.convolution` with the data
  format given (the plugin has the kernels; TensorFlow's eager tape reads a 3-D convolution's
  data format back for its gradient, which fails when it was left unset).
- Keras's `LossScaleOptimizer` (mixed precision) checks its gradients with an IsFinite, a bool
  All and a Pack per gradient: on an H200, ResNet-50's 161 gradients took ~1,200 dispatches and
  ~10 ms of GPU time per step (bench/RESULTS.md, session 26). When every accelerator is a tfwgpu
  device, the check is `is_finite(sum over gradients of sum(g - g))` instead: the same answer
  (x - x is 0 for finite values and NaN for inf and NaN), one fused reduction per gradient
  (`TFWGPU_FINITE_CHECK=concat`: one concatenation and one reduction; opt-in, unmeasured).
- Keras's BatchNormalization casts float16 inputs (mixed precision) to float32, computes the
  moments, normalizes in float32 and casts back: on an H200 the casts alone took ~10 ms of a
  ResNet-50 step (bench/RESULTS.md, session 26). When every accelerator is a tfwgpu device, a
  float16 layer (4-D, channels last or first; no mask, renorm or synchronized statistics) is
  one FusedBatchNormV3 on the halves (float32 statistics; FusedBatchNormGradV3 for its
  gradient), with Keras's moving-statistics update (the biased batch variance, from
  TensorFlow's Bessel-corrected one). Inside Keras's `fit` the device scope is not visible when
  the step is traced, so a model pinned to `/CPU:0` takes it too (TensorFlow's CPU kernel: the
  same numbers within float16 rounding). float32 layers take it with `TFWGPU_KERAS_FUSED_BN=1`
  (opt-in until measured against the plugin's fusion of Keras's own float32 graph).
- In eager mode, `AssignAddVariableOp`, `AssignSubVariableOp` and `ResourceGather` on a tfwgpu
  variable cannot run: TensorFlow's own kernels for them compute on the CPU, and TensorFlow
  2.21 does not give plugins access to variable buffers. Eagerly, these ops become a read, an
  AddV2/Sub/GatherV2 and an assign, which run on the device. (Inside `tf.function` the plugin's
  graph rewrite does the same.)
- In eager mode, the fused optimizer updates (`ResourceApplyAdam`, `ResourceApplyMomentum`...,
  used by the `tf.compat.v1.train` optimizers and tf-keras) on tfwgpu variables have no kernel
  that can reach the variables' buffers. Eagerly (through `gen_training_ops` and `tf.raw_ops`),
  they become reads, the update as elementwise ops in the order of operations of TensorFlow's
  CPU functors, and assigns: the same expansion as the plugin's graph rewrite
  (crates/plugin/src/graph/apply.rs) does inside `tf.function`.
- `tf.distribute.MirroredStrategy()` without `cross_device_ops`, over two or more devices that
  are all tfwgpu GPUs, all-reduces with `ReductionToOneDevice` instead of TensorFlow's default
  ring of collective ops: without NCCL the ring's two hops each cross the host, and on two
  H200s the CNN's two-GPU step took 8.9 ms with the ring against 7.3 ms (bench/RESULTS.md,
  session 8). `TFWGPU_MIRRORED_REDUCE=tensorflow` keeps TensorFlow's choice,
  `TFWGPU_MIRRORED_REDUCE=exchange` uses `exchange_all_reduce()` (every device sums all the
  replicas' values itself: one host round trip instead of two); an explicit
  `cross_device_ops` is left alone.
- TensorFlow 2.21 runs every eager op as a one-op function (`run_eager_op_as_function`, set
  unconditionally when its context is made). A function's outputs live on its device, so an
  eager op on a tfwgpu GPU whose kernel writes an output in host memory gets that output
  copied to the device when the function returns, and reading it back then syncs the device
  and copies it to the host again. Keras `fit` does this every step: `Optional.has_value()` on
  the train function's result (`OptionalHasValue`, `HostMemory("has_value")` on GPUs) is a
  1-byte upload, a device sync and a 1-byte read, with TensorFlow's event manager's thread
  hops for each copy. With `TFWGPU_EAGER_OPS_DIRECT=1`, when a tfwgpu GPU is listed, the
  context is made with eager ops run as kernels (TensorFlow's own option, its behaviour before
  2.9 and on request since): the flag stays on the host and the read is free. The values are
  the same; the option is the process's, so it applies to eager ops on every device. Opt-in:
  on the H200 (session 14, bench/RESULTS.md) TensorFlow's direct path cost more than the copies
  it saves: Keras `fit`'s floor 1.39 against 1.26 ms per step (median of 4 processes each),
  inference and `tf.function` calls +0.04 ms, TensorFlow's own CPU device slower too.
"""
import contextvars
import importlib.abc
import importlib.util
import sys

_WGPU = {}


def _is_tfwgpu_device(device):
    """True when `device` (a device string) names a tfwgpu GPU."""
    if "GPU" not in device:
        return False
    if device not in _WGPU:
        import tensorflow as tf

        try:
            spec = tf.DeviceSpec.from_string(device)
            phys = tf.config.list_physical_devices("GPU")
            index = spec.device_index or 0
            _WGPU[device] = (
                index < len(phys)
                and tf.config.experimental.get_device_details(phys[index]).get("device_name") == "WGPU"
            )
        except Exception:
            _WGPU[device] = False
    return _WGPU[device]


def _only_tfwgpu_accelerators():
    import tensorflow as tf

    accelerators = [d for d in tf.config.list_physical_devices() if d.device_type != "CPU"]
    return bool(accelerators) and all(
        tf.config.experimental.get_device_details(d).get("device_name") == "WGPU" for d in accelerators
    )


def _patch_keras_trainer(module):
    trainer = getattr(module, "Trainer", None)
    original = getattr(trainer, "_resolve_auto_jit_compile", None)
    if original is None or getattr(original, "_tfwgpu", False):
        return

    def _resolve_auto_jit_compile(self):
        try:
            if _only_tfwgpu_accelerators():
                return False
        except Exception:  # never break Keras: fall back to its own rule
            pass
        return original(self)

    _resolve_auto_jit_compile._tfwgpu = True
    trainer._resolve_auto_jit_compile = _resolve_auto_jit_compile


def _scope_on_cpu():
    """Whether the ops being made now are asked to run on a CPU (the device scope)."""
    from tensorflow.python.eager import context

    if context.executing_eagerly():
        name = context.context().device_name or ""
    else:
        import tensorflow as tf

        name = tf.raw_ops.NoOp().device or ""
    return "CPU" in name.upper()


def _patch_keras_nn(module):
    original = getattr(module, "conv", None)
    if original is None or getattr(original, "_tfwgpu", False):
        return

    def conv(inputs, kernel, strides=1, padding="valid", data_format=None, dilation_rate=1):
        try:
            fmt = module.backend.standardize_data_format(data_format)
            channels = inputs.shape[-1] if fmt == "channels_last" else inputs.shape[1]
            # Keras compiles these with XLA (TensorFlow's CPU kernels lack them), which has no
            # compiler for a PluggableDevice; the plugin's kernels take them as they are.
            grouped = channels != kernel.shape[-2]
            keras_xla = (fmt == "channels_first" and len(inputs.shape) == 5) or grouped
            direct = keras_xla and _only_tfwgpu_accelerators() and not _scope_on_cpu()
        except Exception:  # never break Keras: its own path
            direct = False
        if not direct:
            return original(inputs, kernel, strides, padding, data_format, dilation_rate)
        import tensorflow as tf

        return tf.nn.convolution(
            inputs,
            kernel,
            strides,
            padding.upper(),
            data_format=module._convert_data_format(fmt, len(inputs.shape)),
            dilations=dilation_rate,
        )

    conv._tfwgpu = True
    conv.__name__, conv.__doc__, conv.__wrapped__ = original.__name__, original.__doc__, original
    module.conv = conv


def _patch_loss_scale_optimizer(module):
    cls = getattr(module, "LossScaleOptimizer", None)
    original = getattr(cls, "check_finite", None)
    if original is None or getattr(original, "_tfwgpu", False):
        return

    def check_finite(self, grads):
        try:
            import os

            import tensorflow as tf

            take = (
                module.backend.backend() == "tensorflow"
                and _only_tfwgpu_accelerators()
                and not _scope_on_cpu()
            )
        except Exception:  # never break Keras: its own check
            take = False
        if not take:
            return original(self, grads)
        values = []
        for g in grads:
            if g is None:
                continue
            v = g.values if isinstance(g, tf.IndexedSlices) else tf.convert_to_tensor(g)
            if v.dtype.is_floating:  # Keras's isfinite of an integer tensor is all true
                values.append(v)
        if not values:
            return tf.constant(True)
        # x - x is 0 for every finite x and NaN for inf and NaN: the sum is 0 when every
        # element is finite, NaN otherwise, and never overflows. (Not x * 0: TensorFlow's
        # constant folding may replace a product by a zero constant with zeros.) On a tfwgpu
        # GPU the difference and the sum are one fused reduction per gradient, in place of
        # Keras's IsFinite, bool All (three dispatches) and a Pack of the flags; with
        # `TFWGPU_FINITE_CHECK=concat` (opt-in, not measured yet) the gradients are
        # concatenated (float32) and reduced once: three kernel calls in all, for a copy of them.
        if os.environ.get("TFWGPU_FINITE_CHECK", "").strip() == "concat":
            flat = [tf.reshape(tf.cast(v, tf.float32), [-1]) for v in values]
            whole = flat[0] if len(flat) == 1 else tf.concat(flat, 0)
            return tf.math.is_finite(tf.reduce_sum(whole - whole))
        parts = [tf.cast(tf.reduce_sum(v - v), tf.float32) for v in values]
        total = parts[0] if len(parts) == 1 else tf.add_n(parts)
        return tf.math.is_finite(total)

    check_finite._tfwgpu = True
    check_finite.__name__, check_finite.__doc__ = original.__name__, original.__doc__
    check_finite.__wrapped__ = original
    cls.check_finite = check_finite


def _patch_keras_batch_norm(module):
    cls = getattr(module, "BatchNormalization", None)
    original = getattr(cls, "call", None)
    if original is None or getattr(original, "_tfwgpu", False):
        return

    def call(self, inputs, training=None, mask=None):
        try:
            import tensorflow as tf

            take = (
                mask is None
                and not self.renorm
                and not self.synchronized
                and _fused_batch_norm_dtype(self, inputs, tf)
                and len(inputs.shape) == 4
                and self.axis % 4 in (1, 3)
                and module.backend.backend() == "tensorflow"
                and _only_tfwgpu_accelerators()
                and not _scope_on_cpu()
            )
        except Exception:  # never break Keras: its own layer
            take = False
        if not take:
            return original(self, inputs, training=training, mask=mask)
        return _fused_batch_norm(tf, self, inputs, training)

    call._tfwgpu = True
    call.__name__, call.__doc__, call.__wrapped__ = original.__name__, original.__doc__, original
    cls.call = call


def _fused_batch_norm_dtype(layer, x, tf):
    """Whether the layer's input dtype takes the fused op: float16 under mixed precision; float32
    only with `TFWGPU_KERAS_FUSED_BN=1` (not measured against the plugin's fusion of Keras's own
    float32 graph yet)."""
    import os

    dtype = getattr(x, "dtype", None)
    if dtype == tf.float16:
        return layer.compute_dtype == "float16"
    if dtype == tf.float32 and os.environ.get("TFWGPU_KERAS_FUSED_BN", "0").strip() == "1":
        return layer.compute_dtype == "float32"
    return False


def _fused_batch_norm(tf, layer, x, training):
    """Keras's BatchNormalization of a 4-D NHWC/NCHW tensor as one FusedBatchNormV3 (x and y in
    the input's dtype, float32 statistics and parameters; its gradient FusedBatchNormGradV3),
    with Keras's moving-statistics update."""
    axis = layer.axis % 4
    fmt = "NHWC" if axis == 3 else "NCHW"
    c = layer.moving_mean.shape[0]
    f32 = tf.float32
    gamma = tf.cast(layer.gamma, f32) if layer.scale else tf.ones([c], f32)
    beta = tf.cast(layer.beta, f32) if layer.center else tf.zeros([c], f32)
    if training and layer.trainable:
        empty = tf.zeros([0], f32)
        y, mean, var = tf.raw_ops.FusedBatchNormV3(
            x=x, scale=gamma, offset=beta, mean=empty, variance=empty, epsilon=layer.epsilon,
            exponential_avg_factor=1.0, data_format=fmt, is_training=True,
        )[:3]
        # TensorFlow's batch variance has Bessel's correction (n / (n - 1)); Keras's moving
        # variance follows the biased one of its moments.
        n = tf.cast(tf.size(x, out_type=tf.int64) // c, f32)
        # (n = 1: TensorFlow's variance is 0; an empty batch's NaN stays NaN, as in Keras.)
        var = tf.where(n > 1.0, var * ((n - 1.0) / tf.maximum(n, 1.0)), var * 0.0)
        m = layer.momentum
        moving_mean = tf.cast(layer.moving_mean, f32)
        moving_var = tf.cast(layer.moving_variance, f32)
        layer.moving_mean.assign(moving_mean * m + mean * (1.0 - m))
        layer.moving_variance.assign(moving_var * m + var * (1.0 - m))
    else:
        y = tf.raw_ops.FusedBatchNormV3(
            x=x, scale=gamma, offset=beta, mean=tf.cast(layer.moving_mean, f32),
            variance=tf.cast(layer.moving_variance, f32), epsilon=layer.epsilon,
            exponential_avg_factor=1.0, data_format=fmt, is_training=False,
        )[0]
    return y


def _fused_rnn():
    """Whether Keras's LSTM and GRU layers may take the plugin's fused recurrent op: not
    switched off (`TFWGPU_FUSED_RNN=0`) and TensorFlow built without CUDA or ROCm (Keras keeps
    its gate orders there, the orders the plugin's kernel takes)."""
    import os

    if os.environ.get("TFWGPU_FUSED_RNN", "1").strip() == "0":
        return False
    import tensorflow as tf

    info = tf.sysconfig.get_build_info()
    # CUDA builds: Keras swaps the GRU's gates into cuDNN's order; ROCm builds: it moves the
    # LSTM's into MIOpen's. The kernel takes the order Keras keeps elsewhere.
    return not (info.get("is_cuda_build", False) or info.get("is_rocm_build", False))


def _patch_keras_rnn(module):
    original = getattr(module, "_is_gpu_available", None)
    if original is None or getattr(original, "_tfwgpu", False):
        return
    import inspect

    def _is_gpu_available():
        try:
            if _only_tfwgpu_accelerators():
                return _fused_rnn()
        except Exception:  # never break Keras: fall back to its own rule
            pass
        return original()

    _is_gpu_available._tfwgpu = True
    module._is_gpu_available = _is_gpu_available

    def with_masks_packed(fused):
        signature = inspect.signature(fused)

        def layer(*args, **kwargs):
            try:
                arguments = signature.bind(*args, **kwargs).arguments
                masked = arguments.get("mask") is not None and _only_tfwgpu_accelerators()
            except Exception:  # never break Keras: keep its own path
                masked = False
            if not masked:
                return fused(*args, **kwargs)
            return _masked_fused(module, fused, signature, dict(arguments))

        layer.__name__, layer.__doc__, layer.__wrapped__ = fused.__name__, fused.__doc__, fused
        return layer

    for name in ("lstm", "gru"):
        fused = getattr(module, name, None)
        if fused is not None:
            setattr(module, name, with_masks_packed(fused))

    # Keras's fused path asserts that masks are right-padded and takes the lengths from them;
    # the masks the hook passes are right-padded by construction, with lengths it computed.
    for name, packed in (
        ("_assert_valid_mask", lambda lengths, mask: None),
        ("_compute_sequence_length_from_mask", lambda lengths, mask, time_major: lengths),
    ):
        keras_fn = getattr(module, name, None)
        if keras_fn is not None:
            setattr(module, name, _while_packed(keras_fn, packed))

    standardize = getattr(module, "_standardize_cudnn_weights", None)
    if standardize is not None:

        def _standardize_cudnn_weights(weights, biases, shape, transpose_weights=False):
            try:
                params = _whole_params(weights, biases, shape, transpose_weights)
            except Exception:  # never break Keras: keep its own layout code
                params = None
            if params is None:
                return standardize(weights, biases, shape, transpose_weights=transpose_weights)
            return params

        _standardize_cudnn_weights.__wrapped__ = standardize
        module._standardize_cudnn_weights = _standardize_cudnn_weights


def _split_source(parts, axis):
    """The tensor that one `tf.split(x, len(parts), axis)` cut into `parts` (all its outputs, in
    order), or None (eager tensors, other ops, another order)."""
    from tensorflow.python.framework import tensor_util

    op = parts[0].op  # eager tensors raise AttributeError: the caller keeps Keras's code
    if op.type != "Split" or len(op.outputs) != len(parts):
        return None
    if any(p.op is not op or p.value_index != k for k, p in enumerate(parts)):
        return None
    value = op.inputs[1]
    a = tensor_util.constant_value(op.inputs[0])
    rank = value.shape.rank
    if a is None or rank is None or int(a) % rank != axis % rank:
        return None
    return value


def _whole_params(weights, biases, shape, transpose_weights):
    """Keras's flat cuDNN params from whole tensors: inside a graph, Keras cuts each kernel into
    its gates (`tf.split(kernel, n, axis=1)`), transposes each gate and concatenates them, which
    is the transposed kernel; and cuts the biases apart to concatenate them again. That is ~20
    kernels forward and ~25 in the gradient per layer (a training step's largest part in
    ~90 kernel calls); the same values come from one transpose per kernel and one concat. None
    where the parts are not whole splits (eager tensors, ROCm's reordered gates)."""
    import tensorflow as tf

    if not transpose_weights or len(weights) % 2 or not biases:
        return None
    try:
        if shape.shape.rank != 1 or tf.get_static_value(shape).tolist() != [-1]:
            return None
    except (AttributeError, TypeError):
        return None
    half = len(weights) // 2
    kernel = _split_source(weights[:half], 1)
    recurrent = _split_source(weights[half:], 1)
    bias = _split_source(biases, 0)
    if kernel is None or recurrent is None or bias is None or bias.shape.rank != 1:
        return None
    flat = lambda t: tf.reshape(t, [-1])  # noqa: E731
    return tf.concat([flat(tf.transpose(kernel)), flat(tf.transpose(recurrent)), bias], axis=0)


# The lengths of the right-padded sequences the hook passes to Keras's fused path (None outside
# such a call), and the calling layer's `zero_output_for_mask` (which the backend is not given).
_PACKED_LENGTHS = contextvars.ContextVar("tfwgpu_packed_lengths", default=None)
_ZERO_OUTPUT_FOR_MASK = contextvars.ContextVar("tfwgpu_zero_output_for_mask", default=False)


def _while_packed(keras_fn, packed):
    """`keras_fn`, or `packed(lengths, ...)` inside the hook's call of Keras's fused path."""

    def fn(*args, **kwargs):
        lengths = _PACKED_LENGTHS.get()
        if lengths is None:
            return keras_fn(*args, **kwargs)
        return packed(lengths, *args, **kwargs)

    fn.__name__, fn.__doc__, fn.__wrapped__ = keras_fn.__name__, keras_fn.__doc__, keras_fn
    return fn


def _patch_keras_rnn_layer(class_name):
    """Lets the backend's `lstm` / `gru` know the calling layer's `zero_output_for_mask`."""

    def patch(module):
        cls = getattr(module, class_name, None)
        original = getattr(cls, "inner_loop", None)
        if original is None or getattr(original, "_tfwgpu", False):
            return

        def inner_loop(self, *args, **kwargs):
            token = _ZERO_OUTPUT_FOR_MASK.set(bool(getattr(self, "zero_output_for_mask", False)))
            try:
                return original(self, *args, **kwargs)
            finally:
                _ZERO_OUTPUT_FOR_MASK.reset(token)

        inner_loop._tfwgpu = True
        inner_loop.__name__, inner_loop.__doc__, inner_loop.__wrapped__ = "inner_loop", original.__doc__, original
        cls.inner_loop = inner_loop

    return patch


def _masked_fused(module, fused, signature, a):
    """Keras's fused `lstm` / `gru` (`fused`, arguments `a`) on masked inputs, with the results
    of Keras's generic loop for any mask. The loop skips a masked timestep: the state is kept,
    and the output is the previous step's (zeros before the first unmasked step), or zeros with
    the layer's `zero_output_for_mask`. So each sequence's unmasked steps are moved to its front,
    in order (one gather), the fused op runs them as a right-padded sequence of that length
    (cuDNN's semantics: its final state is the state after the last unmasked step), and its
    outputs are moved back (a gather). Nothing is read back; Keras's own fused path asserts
    right-padding instead, a read of the GPU per call. NotImplementedError (Keras's generic loop)
    where the fused op does not apply."""
    import tensorflow as tf

    if a.get("time_major", False) or not _cudnn_ok(module, signature, a):
        raise NotImplementedError
    try:
        x, mask = a["inputs"], tf.convert_to_tensor(a["mask"])
        if mask.shape.rank != 2 or x.shape.rank != 3:
            raise NotImplementedError
        mask = tf.cast(mask, tf.bool)
        if a.get("go_backwards", False):
            # The loop reads both backwards and returns the outputs in the order it ran.
            x, mask = tf.reverse(x, [1]), tf.reverse(mask, [1])
        packing = _MaskPacking(tf, mask)
        a["inputs"], a["go_backwards"] = packing.pack(x), False
    except NotImplementedError:
        raise
    except Exception:  # never break Keras: its generic loop
        raise NotImplementedError
    token = _PACKED_LENGTHS.set(packing.lengths)
    try:
        last, outputs, states = fused(**a)
    finally:
        _PACKED_LENGTHS.reset(token)
    zeros = _ZERO_OUTPUT_FOR_MASK.get()
    # `last` is the final state h: the output of the last unmasked step.
    last = packing.keep(packing.last_mask(zeros)[:, None], last)
    if a.get("return_sequences", False):
        outputs = packing.unpack(outputs, zeros)
    else:
        outputs = tf.expand_dims(last, 1)
    return last, outputs, states


def _cudnn_ok(module, signature, a):
    """Keras's own test of whether the fused op applies (activations, unroll, bias, GRU's
    reset_after), asked before the packing ops are built."""
    kwargs = {"use_bias": a.get("bias") is not None}
    if "reset_after" in signature.parameters:
        kwargs["reset_after"] = a.get("reset_after", signature.parameters["reset_after"].default)
    return module.cudnn_ok(a["activation"], a["recurrent_activation"], a.get("unroll", False), **kwargs)


class _MaskPacking:
    """Where each timestep of a batch-major [B, T] mask goes when every sequence's unmasked
    steps are moved to its front, in order, and its masked ones after them, in order: a
    permutation of the B*T rows of the flattened [B*T, features] inputs. Positions within a
    sequence are counted in float32 (Cumsum; exact below 2^24 timesteps), flattened and
    converted once; the sequences' offsets are added in int32 (a device kernel inside graphs).
    The int32 indices are made in their final [B*T, 1] shape: TensorFlow's int32 reshapes and
    slices run in host memory and would read them back."""

    def __init__(self, tf, mask):
        self.tf = tf
        shape = tf.shape(mask)
        b, t = shape[0], shape[1]
        if mask.shape[1] is not None and mask.shape[1] >= 1 << 24:
            raise NotImplementedError
        self.mask = mask
        self.rows = b * t
        on = tf.cast(mask, tf.float32)
        # count[b, t]: unmasked steps in 0..=t
        self.count = tf.cumsum(on, axis=1)
        lengths = self.count[:, -1:]
        steps = tf.cast(tf.range(t), tf.float32)[None, :]
        # The packed position of step t: its rank among the unmasked steps, or the masked ones
        # after them.
        dest = tf.where(mask, self.count - 1.0, lengths + steps - self.count)
        # Each row's sequence offset, [B*T, 1] int32, made on the host from shapes.
        self.offsets = tf.reshape(tf.range(self.rows) // t * t, [-1, 1])
        self.dest = self._indices(dest)
        self.perm = tf.scatter_nd(self.dest, tf.range(self.rows), self.rows[None])
        self.lengths = tf.cast(tf.reshape(lengths, [-1]), tf.int32)

    def _indices(self, positions):
        """[B*T, 1] int32 row indices from [B, T] float32 positions within each sequence."""
        tf = self.tf
        return tf.cast(tf.reshape(positions, [-1, 1]), tf.int32) + self.offsets

    def _rows(self, v):
        tf = self.tf
        shape = tf.shape(v)
        return tf.reshape(v, tf.concat([self.rows[None], shape[2:]], 0)), shape

    def _gather_rows(self, v, index, gradient):
        """v's rows gathered by `index`, with the gradient `gradient(dy)` of the flat rows:
        TensorFlow's own gradient of a gather would flatten the int32 indices on the host."""
        tf = self.tf
        flat, shape = self._rows(v)
        rows = tf.shape(flat)

        @tf.custom_gradient
        def move(flat):
            return tf.reshape(tf.gather(flat, index), rows), lambda dy: tf.reshape(gradient(dy), rows)

        return tf.reshape(move(flat), shape)

    def _permute(self, v, forward, backward):
        """v's rows gathered by `forward`; the gradient gathered back by `backward` (the inverse
        permutation: no sums)."""
        return self._gather_rows(v, forward, lambda dy: self.tf.gather(dy, backward))

    def pack(self, x):
        return self._permute(x, self.perm, self.dest)

    def last_mask(self, zeros):
        """Whether the loop's last output is the final state: its last step unmasked
        (`zero_output_for_mask`), or any step unmasked (it carries the last one's output)."""
        return self.mask[:, -1] if zeros else self.count[:, -1] > 0.0

    def unpack(self, outputs, zeros):
        """The loop's [B, T, H] outputs from the packed ones (zeros past each length)."""
        tf = self.tf
        if zeros:
            # A masked step's packed position lies past the length: zeros there.
            return self._permute(outputs, self.dest, self.perm)
        # Step t outputs the packed output of the last unmasked step up to t: several steps
        # read one row, so the gradient sums (UnsortedSegmentSum, float32 on the GPU; its
        # [B*T, 1] ids index the rows of the gradient seen as [B*T, 1, H]).
        held = self._indices(tf.maximum(self.count - 1.0, 0.0))
        got = self._gather_rows(
            tf.cast(outputs, tf.float32),
            held,
            lambda dy: tf.math.unsorted_segment_sum(tf.expand_dims(dy, 1), held, self.rows),
        )
        got = self.keep((self.count > 0.0)[:, :, None], got)
        return tf.cast(got, outputs.dtype)

    def keep(self, where, v):
        """v where `where` (broadcast), zeros elsewhere, with the gradient selected the same
        way: TensorFlow's gradient of a select sums over the broadcast axes (a Sum of unknown
        axes when the batch is unknown to the graph; float16 Sum runs on the CPU, a read)."""
        tf = self.tf

        @tf.custom_gradient
        def select(v):
            pick = lambda u: tf.where(where, u, tf.zeros_like(u))  # noqa: E731
            return pick(v), pick

        return select(v)


def _eager_on_tfwgpu(resource):
    from tensorflow.python.eager import context

    return context.executing_eagerly() and _is_tfwgpu_device(getattr(resource, "device", "") or "")


def _patch_variable_ops(gen):
    if getattr(gen, "_tfwgpu", False):
        return
    add, sub, gather = gen.assign_add_variable_op, gen.assign_sub_variable_op, gen.resource_gather

    def _update(original, combine):
        def op(resource, value, name=None):
            if not _eager_on_tfwgpu(resource):
                return original(resource, value, name=name)
            from tensorflow.python.ops import math_ops

            value = __import__("tensorflow").convert_to_tensor(value)
            current = gen.read_variable_op(resource, value.dtype)
            return gen.assign_variable_op(resource, combine(math_ops, current, value), name=name)

        return op

    def resource_gather(resource, indices, dtype, batch_dims=0, validate_indices=True, name=None):
        if not _eager_on_tfwgpu(resource):
            return gather(resource, indices, dtype, batch_dims=batch_dims, validate_indices=validate_indices, name=name)
        from tensorflow.python.ops import array_ops

        return array_ops.gather(gen.read_variable_op(resource, dtype), indices, batch_dims=batch_dims, name=name)

    gen.assign_add_variable_op = _update(add, lambda m, a, b: m.add(a, b))
    gen.assign_sub_variable_op = _update(sub, lambda m, a, b: m.subtract(a, b))
    gen.resource_gather = resource_gather
    gen._tfwgpu = True


# TensorFlow op -> (its function in gen_training_ops, resource inputs, tensor inputs of type T)
_TRAINING_OPS = {
    "ResourceApplyGradientDescent": ("resource_apply_gradient_descent", ("var",), ("alpha", "delta")),
    "ResourceApplyMomentum": ("resource_apply_momentum", ("var", "accum"), ("lr", "grad", "momentum")),
    "ResourceApplyKerasMomentum": ("resource_apply_keras_momentum", ("var", "accum"), ("lr", "grad", "momentum")),
    "ResourceApplyAdam": (
        "resource_apply_adam",
        ("var", "m", "v"),
        ("beta1_power", "beta2_power", "lr", "beta1", "beta2", "epsilon", "grad"),
    ),
    "ResourceApplyRMSProp": ("resource_apply_rms_prop", ("var", "ms", "mom"), ("lr", "rho", "momentum", "epsilon", "grad")),
    "ResourceApplyCenteredRMSProp": (
        "resource_apply_centered_rms_prop",
        ("var", "mg", "ms", "mom"),
        ("lr", "rho", "momentum", "epsilon", "grad"),
    ),
    "ResourceApplyAdagrad": ("resource_apply_adagrad", ("var", "accum"), ("lr", "grad")),
    "ResourceApplyAdagradV2": ("resource_apply_adagrad_v2", ("var", "accum"), ("lr", "epsilon", "grad")),
}


class _Math:
    """The elementwise ops of the updates, one TensorFlow op per operation of the CPU functors
    (tensorflow/core/kernels/training_ops.cc), so that the rounding matches theirs."""

    def __init__(self, dtype):
        from tensorflow.python.framework import constant_op
        from tensorflow.python.ops import gen_math_ops

        self.m, self.dtype, self._const = gen_math_ops, dtype, constant_op.constant

    def add(self, a, b):
        return self.m.add_v2(a, b)

    def sub(self, a, b):
        return self.m.sub(a, b)

    def mul(self, a, b):
        return self.m.mul(a, b)

    def div(self, a, b):
        return self.m.real_div(a, b)

    def sqrt(self, a):
        return self.m.sqrt(a)

    def rsqrt(self, a):
        return self.m.rsqrt(a)

    def square(self, a):
        return self.m.square(a)

    def one_minus(self, a):
        return self.m.sub(self._const(1, dtype=self.dtype), a)


def _update_gradient_descent(o, a):
    # var -= grad * lr
    return {"var": o.sub(a["var"], o.mul(a["delta"], a["alpha"]))}


def _update_momentum(o, a):
    # accum = accum * momentum + grad; var -= grad * lr + accum * momentum * lr (nesterov),
    # var -= accum * lr (otherwise)
    accum = o.add(o.mul(a["accum"], a["momentum"]), a["grad"])
    if a["use_nesterov"]:
        step = o.add(o.mul(a["grad"], a["lr"]), o.mul(o.mul(accum, a["momentum"]), a["lr"]))
    else:
        step = o.mul(accum, a["lr"])
    return {"accum": accum, "var": o.sub(a["var"], step)}


def _update_keras_momentum(o, a):
    # accum = accum * momentum - grad * lr; var += accum * momentum - grad * lr (nesterov),
    # var += accum (otherwise)
    grad_lr = o.mul(a["grad"], a["lr"])
    accum = o.sub(o.mul(a["accum"], a["momentum"]), grad_lr)
    step = o.sub(o.mul(accum, a["momentum"]), grad_lr) if a["use_nesterov"] else accum
    return {"accum": accum, "var": o.add(a["var"], step)}


def _update_adam(o, a):
    # alpha = lr * sqrt(1 - beta2_power) / (1 - beta1_power)
    # m += (grad - m) * (1 - beta1); v += (grad^2 - v) * (1 - beta2)
    # var -= ((grad * (1 - beta1) + beta1 * m) * alpha) / (sqrt(v) + epsilon)  (nesterov)
    # var -= (m * alpha) / (sqrt(v) + epsilon)                                 (otherwise)
    g = a["grad"]
    alpha = o.div(o.mul(a["lr"], o.sqrt(o.one_minus(a["beta2_power"]))), o.one_minus(a["beta1_power"]))
    one_minus_beta1 = o.one_minus(a["beta1"])
    m = o.add(a["m"], o.mul(o.sub(g, a["m"]), one_minus_beta1))
    v = o.add(a["v"], o.mul(o.sub(o.square(g), a["v"]), o.one_minus(a["beta2"])))
    if a["use_nesterov"]:
        num = o.mul(o.add(o.mul(g, one_minus_beta1), o.mul(a["beta1"], m)), alpha)
    else:
        num = o.mul(m, alpha)
    var = o.sub(a["var"], o.div(num, o.add(o.sqrt(v), a["epsilon"])))
    return {"m": m, "v": v, "var": var}


def _update_rms_prop(o, a):
    # ms += (grad^2 - ms) * (1 - rho); mom = mom * momentum + (grad * lr) / sqrt(ms + epsilon)
    # var -= mom
    g = a["grad"]
    ms = o.add(a["ms"], o.mul(o.sub(o.square(g), a["ms"]), o.one_minus(a["rho"])))
    mom = o.add(o.mul(a["mom"], a["momentum"]), o.div(o.mul(g, a["lr"]), o.sqrt(o.add(ms, a["epsilon"]))))
    return {"ms": ms, "mom": mom, "var": o.sub(a["var"], mom)}


def _update_centered_rms_prop(o, a):
    # ms += (grad^2 - ms) * (1 - rho); mg += (grad - mg) * (1 - rho)
    # mom = mom * momentum + (grad * lr) / sqrt((ms - mg^2) + epsilon); var -= mom
    g = a["grad"]
    one_minus_rho = o.one_minus(a["rho"])
    ms = o.add(a["ms"], o.mul(o.sub(o.square(g), a["ms"]), one_minus_rho))
    mg = o.add(a["mg"], o.mul(o.sub(g, a["mg"]), one_minus_rho))
    denom = o.add(o.sub(ms, o.square(mg)), a["epsilon"])
    mom = o.add(o.mul(a["mom"], a["momentum"]), o.div(o.mul(g, a["lr"]), o.sqrt(denom)))
    return {"ms": ms, "mg": mg, "mom": mom, "var": o.sub(a["var"], mom)}


def _update_adagrad(o, a, v2):
    # accum += grad^2 (update_slots); var -= grad * lr * rsqrt(accum) (Adagrad),
    # var -= grad * lr / (sqrt(accum) + epsilon) (AdagradV2)
    g = a["grad"]
    accum = o.add(a["accum"], o.square(g)) if a["update_slots"] else a["accum"]
    if v2:
        step = o.div(o.mul(g, a["lr"]), o.add(o.sqrt(accum), a["epsilon"]))
    else:
        step = o.mul(o.mul(g, a["lr"]), o.rsqrt(accum))
    new = {"var": o.sub(a["var"], step)}
    if a["update_slots"]:
        new["accum"] = accum
    return new


_UPDATES = {
    "ResourceApplyGradientDescent": _update_gradient_descent,
    "ResourceApplyMomentum": _update_momentum,
    "ResourceApplyKerasMomentum": _update_keras_momentum,
    "ResourceApplyAdam": _update_adam,
    "ResourceApplyRMSProp": _update_rms_prop,
    "ResourceApplyCenteredRMSProp": _update_centered_rms_prop,
    "ResourceApplyAdagrad": lambda o, a: _update_adagrad(o, a, False),
    "ResourceApplyAdagradV2": lambda o, a: _update_adagrad(o, a, True),
}


def _update_dtype(op, args):
    """The type T of an update's tensor arguments, as the op's own argument conversion finds
    it: the first tensor argument's, else the type of the first argument converted."""
    import tensorflow as tf

    tensors = _TRAINING_OPS[op][2]
    for n in tensors:
        if isinstance(args[n], (tf.Tensor, tf.Variable)):
            return args[n].dtype
    try:
        return tf.convert_to_tensor(args[tensors[0]]).dtype
    except (TypeError, ValueError):
        return None


def _apply_eagerly(op, args):
    """Runs the update `op` on the variables of `args` (its arguments by name); T is float32
    or float16 (the float types of the plugin's kernels)."""
    import tensorflow as tf
    from tensorflow.python.framework import errors
    from tensorflow.python.ops import gen_resource_variable_ops as rv

    _, resources, tensors = _TRAINING_OPS[op]
    a = dict(args)
    with tf.device(args["var"].device):
        dtype = _update_dtype(op, args)
        for n in tensors:
            a[n] = tf.convert_to_tensor(args[n], dtype=dtype)
        for n in resources:
            a[n] = rv.read_variable_op(args[n], dtype)
        # The checks of TensorFlow's kernels, with their messages.
        for n in tensors:
            if n not in ("grad", "delta") and a[n].shape.rank != 0:
                raise errors.InvalidArgumentError(None, None, f"{n} is not a scalar: {a[n].shape.as_list()}")
        var_shape = a["var"].shape
        for n in resources[1:] + (("delta",) if "delta" in a else ("grad",)):
            if a[n].shape != var_shape:
                raise errors.InvalidArgumentError(
                    None, None, f"var and {n} do not have the same shape{var_shape.as_list()} {a[n].shape.as_list()}"
                )
        new = _UPDATES[op](_Math(dtype), a)
        for n in resources:
            if n in new:
                rv.assign_variable_op(args[n], new[n])
    return None


def _patch_training_ops(gen):
    if getattr(gen, "_tfwgpu_training", False):
        return
    import inspect

    for op, (fname, _, _) in _TRAINING_OPS.items():
        original = getattr(gen, fname, None)
        if original is None:
            continue
        signature = inspect.signature(original)

        def hooked(*args, _op=op, _original=original, _signature=signature, **kwargs):
            try:
                bound = _signature.bind(*args, **kwargs)
            except TypeError:
                return _original(*args, **kwargs)
            bound.apply_defaults()
            if not _eager_on_tfwgpu(bound.arguments["var"]):
                return _original(*args, **kwargs)
            import tensorflow as tf

            if _update_dtype(_op, bound.arguments) not in (tf.float32, tf.float16):
                # TensorFlow's own answer (no kernel for that type on a GPU).
                return _original(*args, **kwargs)
            return _apply_eagerly(_op, bound.arguments)

        hooked.__name__, hooked.__doc__, hooked.__wrapped__ = fname, original.__doc__, original
        setattr(gen, fname, hooked)
    gen._tfwgpu_training = True


def _patch_raw_ops(module):
    """tf.raw_ops.ResourceApply*: copies of the generated functions, made when TensorFlow
    loaded, so they are replaced by keyword-only calls of the hooked functions."""
    if getattr(module, "_tfwgpu_training", False):
        return
    from tensorflow.python.ops import gen_training_ops as gen

    _patch_training_ops(gen)
    for op, (fname, _, _) in _TRAINING_OPS.items():
        original = getattr(module, op, None)
        if original is None:
            continue

        def raw(*args, _original=original, _fname=fname, **kwargs):
            if args:  # the original says that raw ops take keyword arguments only
                return _original(*args, **kwargs)
            return getattr(gen, _fname)(**kwargs)

        raw.__name__, raw.__doc__, raw.__wrapped__ = op, original.__doc__, original
        setattr(module, op, raw)
    module._tfwgpu_training = True


def _patch_mirrored_strategy(module):
    extended = getattr(module, "MirroredExtended", None)
    original = getattr(extended, "__init__", None)
    if original is None or getattr(original, "_tfwgpu", False):
        return

    def __init__(self, container_strategy, devices=None, cross_device_ops=None):
        if cross_device_ops is None:
            try:
                cross_device_ops = _mirrored_reduce(devices)
            except Exception:  # never break TensorFlow: fall back to its own choice
                cross_device_ops = None
        original(self, container_strategy, devices=devices, cross_device_ops=cross_device_ops)

    __init__._tfwgpu = True
    extended.__init__ = __init__


def _mirrored_reduce(devices):
    """The cross-device ops MirroredStrategy gets by default: ReductionToOneDevice over two or
    more tfwgpu GPUs, or the exchange all-reduce with TFWGPU_MIRRORED_REDUCE=exchange (None:
    TensorFlow's own choice)."""
    import os

    setting = os.environ.get("TFWGPU_MIRRORED_REDUCE", "").strip().lower()
    if setting == "tensorflow":
        return None
    import tensorflow as tf

    if devices:
        names = [d if isinstance(d, str) else d.to_string() for d in devices]
    else:
        names = [d.name for d in tf.config.list_logical_devices("GPU")]
    if len(names) < 2 or not all(_is_tfwgpu_device(n) for n in names):
        return None
    if setting == "exchange":
        return exchange_all_reduce()
    return tf.distribute.ReductionToOneDevice()


def exchange_all_reduce():
    """A `tf.distribute.CrossDeviceOps` for tfwgpu GPUs: every device sums all the replicas'
    values itself (`add_n` over them in replica order on each destination; TensorFlow copies
    each value to the other devices), instead of summing on one device and copying the sum
    back (ReductionToOneDevice). Each value crosses the host once per other device, and no
    device waits for another's sum: one host round trip per gradient instead of two. Every
    device adds the same operands in the same order, so the replicas' sums are identical.
    Sparse values (IndexedSlices), one destination, and anything else unusual go to
    ReductionToOneDevice."""
    from tensorflow.python.distribute import cross_device_ops as cdo
    from tensorflow.python.distribute import distribute_utils, reduce_util
    from tensorflow.python.distribute import values as value_lib
    from tensorflow.python.eager import context
    from tensorflow.python.framework import indexed_slices, ops
    from tensorflow.python.ops import math_ops

    class ExchangeAllReduce(cdo.ReductionToOneDevice):
        def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
            values = list(getattr(per_replica_value, "values", None) or [])
            if cdo.check_destinations(destinations):
                devices = cdo.get_devices_from(destinations, self._canonicalize_devices)
            else:
                devices = cdo.get_devices_from(per_replica_value, self._canonicalize_devices)
            if (len(devices) < 2 or not values
                    or any(isinstance(v, indexed_slices.IndexedSlices) for v in values)
                    or reduce_op not in (reduce_util.ReduceOp.SUM, reduce_util.ReduceOp.MEAN)):
                return super().reduce_implementation(
                    reduce_op, per_replica_value, destinations, options)
            out = []
            for d in devices:
                with ops.device(d), context.device_policy(context.DEVICE_PLACEMENT_SILENT):
                    total = math_ops.add_n(values)
                    if reduce_op == reduce_util.ReduceOp.MEAN:
                        total = total / len(values)
                out.append(total)
            return distribute_utils.regroup(out, wrap_class=value_lib.Mirrored)

    return ExchangeAllReduce()


def _eager_ops_direct():
    """Whether eager ops run as kernels rather than one-op functions (`TFWGPU_EAGER_OPS_DIRECT=1`
    and TensorFlow lists a tfwgpu GPU; off by default)."""
    import os

    if os.environ.get("TFWGPU_EAGER_OPS_DIRECT", "0").strip() != "1":
        return False
    try:
        import tensorflow as tf

        return any(
            tf.config.experimental.get_device_details(d).get("device_name") == "WGPU"
            for d in tf.config.list_physical_devices("GPU")
        )
    except Exception:  # noqa: BLE001 - TensorFlow half imported: keep its default
        return False


def _patch_eager_context(module):
    pywrap = getattr(module, "pywrap_tfe", None)
    original = getattr(pywrap, "TFE_ContextOptionsSetRunEagerOpAsFunction", None)
    if original is None or getattr(original, "_tfwgpu", False):
        return

    def set_run_eager_op_as_function(opts, enable):
        if enable and _eager_ops_direct():
            enable = False
        return original(opts, enable)

    set_run_eager_op_as_function._tfwgpu = True
    pywrap.TFE_ContextOptionsSetRunEagerOpAsFunction = set_run_eager_op_as_function


_PATCHES = {
    "keras.src.trainers.trainer": _patch_keras_trainer,
    "keras.src.backend.tensorflow.rnn": _patch_keras_rnn,
    "keras.src.backend.tensorflow.nn": _patch_keras_nn,
    "keras.src.optimizers.loss_scale_optimizer": _patch_loss_scale_optimizer,
    "keras.src.layers.normalization.batch_normalization": _patch_keras_batch_norm,
    "keras.src.layers.rnn.lstm": _patch_keras_rnn_layer("LSTM"),
    "keras.src.layers.rnn.gru": _patch_keras_rnn_layer("GRU"),
    "tensorflow.python.eager.context": _patch_eager_context,
    "tensorflow.python.ops.gen_resource_variable_ops": _patch_variable_ops,
    "tensorflow.python.ops.gen_training_ops": _patch_training_ops,
    "tensorflow._api.v2.raw_ops": _patch_raw_ops,
    "tensorflow._api.v2.compat.v1.raw_ops": _patch_raw_ops,
    "tensorflow._api.v2.compat.v2.raw_ops": _patch_raw_ops,
    "tensorflow.python.distribute.mirrored_strategy": _patch_mirrored_strategy,
}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, patch):
        self._inner, self._patch = inner, patch

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        self._patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, patch)
        return spec


def install():
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
