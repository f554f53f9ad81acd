"""Small fixes applied to TensorFlow and Keras in every process, by `tensorflow_wgpu.pth`.

Each waits for the module it fixes to be imported (importing this module imports nothing
else), and each changes behaviour only for tfwgpu devices:

- Keras 3 resolves `jit_compile="auto"` to True as soon as TensorFlow lists a non-CPU device
  (only Apple GPUs are exempted), and `fit` then fails: XLA has no compiler for a
  PluggableDevice. When every accelerator is a tfwgpu device, "auto" means no XLA; an explicit
  `jit_compile=True` is left alone.
- In eager mode, `AssignAddVariableOp`, `AssignSubVariableOp` and `ResourceGather` on a tfwgpu
  variable cannot run: TensorFlow's own kernels for them compute on the CPU, and TensorFlow
  2.21 does not give plugins access to variable buffers. Eagerly, these ops become a read, an
  AddV2/Sub/GatherV2 and an assign, which run on the device. (Inside `tf.function` the plugin's
  graph rewrite does the same.)
"""
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


_PATCHES = {
    "keras.src.trainers.trainer": _patch_keras_trainer,
    "tensorflow.python.ops.gen_resource_variable_ops": _patch_variable_ops,
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
