# Sourced by the scripts after setup.sh.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The Python whose TensorFlow the plugin builds against and is tested with.
export PYTHON="$root/.venv/bin/python"
# A runtime directory for Mesa (silences its XDG_RUNTIME_DIR warning).
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    export XDG_RUNTIME_DIR="${TMPDIR:-/tmp}/tfwgpu-xdg-$(id -u)"
    mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
fi
