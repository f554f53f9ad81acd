#!/usr/bin/env bash
# Every test, on the best adapter (Mesa lavapipe where there is no GPU):
# - cargo test: the runtime's kernels and machinery against CPU references, the plugin's units;
# - pytest: the plugin in stock TensorFlow (python/tests), after installing tensorflow-wgpu
#   into .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
cargo test --workspace --all-targets
cargo build -p tfwgpu-bench   # the tfwgpu-bench binary that python/tests/test_trace.py replays with
"$PYTHON" -m pip install -q --disable-pip-version-check --no-build-isolation ./python
"$PYTHON" -m pytest -q python/tests
