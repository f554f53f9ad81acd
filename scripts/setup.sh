#!/usr/bin/env bash
# Installs what tfwgpu needs on a Debian machine, and nothing that is already there:
# the Vulkan loader and Mesa's lavapipe (a software Vulkan adapter, so that every GPU test runs
# without a GPU) and the Fashion-MNIST data set. Safe to run again: a second run only checks.
set -euo pipefail
packages=(libvulkan1 mesa-vulkan-drivers dataset-fashion-mnist)
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
