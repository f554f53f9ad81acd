"""PEP 517 backend for tensorflow-wgpu.

Builds `libtfwgpu_plugin.so` with `cargo build --release -p tfwgpu-plugin` (against the
TensorFlow of the Python running the build, or TFWGPU_TF_DIR; the library is taken from
CARGO_TARGET_DIR where that is set, else from the checkout's `target/`) and writes a wheel
holding:
  tensorflow-plugins/libtfwgpu_plugin.so   (TensorFlow loads every library in this folder)
  tensorflow_wgpu/                         (adapter list, version, fallback report)
  tensorflow_wgpu.pth                      (small TensorFlow/Keras fixes for tfwgpu devices: _hooks.py)
"""
import base64
import hashlib
import os
import pathlib
import subprocess
import sys
import zipfile

NAME = "tensorflow_wgpu"
VERSION = "0.1.0"
HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
TAG = "py3-none-linux_x86_64"


def _build_plugin():
    env = dict(os.environ)
    env.setdefault("PYTHON", sys.executable)
    subprocess.run(
        ["cargo", "build", "--release", "-p", "tfwgpu-plugin"], cwd=ROOT, env=env, check=True
    )
    target = pathlib.Path(env.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target.is_absolute():
        target = ROOT / target
    lib = target / "release" / "libtfwgpu_plugin.so"
    if not lib.exists():
        raise RuntimeError(f"cargo did not produce {lib}")
    return lib


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _metadata():
    return (
        "Metadata-Version: 2.1\n"
        f"Name: tensorflow-wgpu\nVersion: {VERSION}\n"
        "Summary: TensorFlow on any GPU: a PluggableDevice whose kernels run through wgpu\n"
        "License: Apache-2.0\nRequires-Python: >=3.9\n"
    )


def _wheel_meta():
    return f"Wheel-Version: 1.0\nGenerator: tfwgpu_build\nRoot-Is-Purelib: false\nTag: {TAG}\n"


def _write_wheel(wheel_directory, files):
    dist = f"{NAME}-{VERSION}.dist-info"
    files = dict(files)
    files[f"{dist}/METADATA"] = _metadata().encode()
    files[f"{dist}/WHEEL"] = _wheel_meta().encode()
    record = [_record_line(p, d) for p, d in files.items()] + [f"{dist}/RECORD,,"]
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    name = f"{NAME}-{VERSION}-{TAG}.whl"
    path = pathlib.Path(wheel_directory) / name
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in files.items():
            info = zipfile.ZipInfo(p, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if p.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, d)
    return name


def _package_files():
    out = {}
    for f in sorted((HERE / NAME).rglob("*.py")):
        out[f.relative_to(HERE).as_posix()] = f.read_bytes()
    return out


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    dist = pathlib.Path(metadata_directory) / f"{NAME}-{VERSION}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(_metadata())
    (dist / "WHEEL").write_text(_wheel_meta())
    return dist.name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    lib = _build_plugin()
    files = _package_files()
    files["tensorflow-plugins/libtfwgpu_plugin.so"] = lib.read_bytes()
    # Run at interpreter start: tensorflow_wgpu/_hooks.py.
    files["tensorflow_wgpu.pth"] = b"import tensorflow_wgpu._hooks as m; m.install()\n"
    return _write_wheel(wheel_directory, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return build_wheel(wheel_directory, config_settings, metadata_directory)
