#!/usr/bin/env bash
# Installs what tfwgpu needs on a Debian machine, and nothing that is already there:
# - Debian packages: the Vulkan loader and Mesa's lavapipe (a software Vulkan adapter, so that
#   every GPU test runs without a GPU), the Fashion-MNIST data set, python3-venv;
# - .venv/: a virtual environment with the pinned TensorFlow (crates/sys/TF_VERSION) and pytest.
# Safe to run again: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(libvulkan1 mesa-vulkan-drivers dataset-fashion-mnist python3-venv)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    sudo=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install ${missing[*]}" >&2; exit 1; }
        sudo=sudo
    fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "setup: cargo not found: install Rust (https://rustup.rs)" >&2; exit 1; }
tf_version=$(cat crates/sys/TF_VERSION)
py=${PYTHON_FOR_VENV:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "$py" -m venv .venv
fi
if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('tensorflow-cpu') != '$tf_version')" 2>/dev/null \
   || ! .venv/bin/python -c "import pytest" 2>/dev/null; then
    echo "setup: installing tensorflow-cpu==$tf_version and pytest into .venv"
    .venv/bin/python -m pip install -q --disable-pip-version-check "tensorflow-cpu==$tf_version" pytest
fi
