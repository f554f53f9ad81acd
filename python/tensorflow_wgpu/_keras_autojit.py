"""Makes Keras's `jit_compile="auto"` choose no XLA on tfwgpu devices.

Keras 3 resolves `jit_compile="auto"` to True as soon as TensorFlow lists a non-CPU device
(only Apple GPUs are exempted), and `fit` then fails: XLA has no compiler for a
PluggableDevice. This module, run at interpreter start by `tensorflow_wgpu.pth`, waits for
Keras's trainer module to be imported and wraps `Trainer._resolve_auto_jit_compile`: when
every accelerator TensorFlow lists is a tfwgpu device, "auto" means no XLA. An explicit
`jit_compile=True` is left alone (and fails as TensorFlow makes it fail). Importing this module
imports nothing else.
"""
import importlib.abc
import importlib.util
import sys

_TARGET = "keras.src.trainers.trainer"


def _only_tfwgpu_accelerators():
    import tensorflow as tf

    accelerators = [d for d in tf.config.list_physical_devices() if d.device_type != "CPU"]
    if not accelerators:
        return False
    return all(
        tf.config.experimental.get_device_details(d).get("device_name") == "WGPU"
        for d in accelerators
    )


def _patch(module):
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


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install():
    if _TARGET in sys.modules:
        _patch(sys.modules[_TARGET])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
