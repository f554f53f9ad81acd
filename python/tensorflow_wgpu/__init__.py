"""tensorflow-wgpu: TensorFlow on any GPU through wgpu.

Installing the package puts the plugin in site-packages/tensorflow-plugins/, where TensorFlow
loads it at import; its adapters then appear as /GPU:N. This module needs no TensorFlow import:

    >>> import tensorflow_wgpu
    >>> tensorflow_wgpu.adapters()        # every adapter wgpu finds, and its TensorFlow device
"""
import ctypes
import json
import pathlib
import sysconfig

__version__ = "0.1.0"


def plugin_path():
    """Path of the installed plugin library."""
    for key in ("platlib", "purelib"):
        p = pathlib.Path(sysconfig.get_paths()[key]) / "tensorflow-plugins" / "libtfwgpu_plugin.so"
        if p.exists():
            return p
    here = pathlib.Path(__file__).resolve().parent.parent / "tensorflow-plugins" / "libtfwgpu_plugin.so"
    if here.exists():
        return here
    raise FileNotFoundError("libtfwgpu_plugin.so is not installed (pip install --no-build-isolation ./python)")


_lib = None
_mark = None


def _loaded_plugin_path():
    """The plugin library this process has already mapped (TensorFlow loaded it), if any: the
    one whose static state (the trace writer) must be reached, not a second copy."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if line.rstrip().endswith("/libtfwgpu_plugin.so"):
                    return line.split(None, 5)[5].strip()
    except OSError:
        pass
    return None


def _plugin():
    global _lib
    if _lib is None:
        # RTLD_GLOBAL is not wanted: the plugin only needs to answer a few questions here. The
        # copy TensorFlow loaded, when it did: its counters are the ones that move (another
        # installed copy would be a second library with counters of its own).
        lib = ctypes.CDLL(_loaded_plugin_path() or str(plugin_path()))
        lib.tfwgpu_adapters_json.restype = ctypes.c_char_p
        lib.tfwgpu_tf_version.restype = ctypes.c_char_p
        lib.tfwgpu_stats_json.restype = ctypes.c_char_p
        _lib = lib
    return _lib


def adapters():
    """Every adapter wgpu finds: name, backend, type, driver, features, and the TensorFlow
    device (`/GPU:N`) it is, or None when it is not opened."""
    return json.loads(_plugin().tfwgpu_adapters_json().decode())


def tensorflow_version():
    """The TensorFlow version the plugin was built for."""
    return _plugin().tfwgpu_tf_version().decode()


def stats():
    """The plugin's counters since the process started: GPU kernel runs per op
    (`gpu_ops`), and copies between host and device (`device_to_host`, `host_to_device`:
    count and bytes)."""
    return json.loads(_plugin().tfwgpu_stats_json().decode())


def trace_mark(label="step"):
    """Writes a step boundary (`{"ev": "mark", "label": label}`) into the kernel trace when the
    process runs with `TFWGPU_TRACE=path`; `tfwgpu-bench replay` reports the time between
    consecutive marks, grouped by the label of the mark that opens each interval. Call it
    after TensorFlow is imported (the plugin must be loaded), between steps: at the start of
    each step and once after the last. Returns whether a mark was written (False when tracing
    is off). Costs a ctypes call."""
    global _mark
    if _mark is None:
        path = _loaded_plugin_path()
        lib = ctypes.CDLL(path) if path else _plugin()
        fn = lib.tfwgpu_trace_mark
        fn.argtypes = [ctypes.c_char_p]
        fn.restype = ctypes.c_int
        _mark = fn
    return bool(_mark(str(label).encode()))
