#!/usr/bin/env bash
# Every test: the runtime's kernels and machinery against CPU references, on the best adapter
# (Mesa lavapipe where there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
cargo test --workspace --all-targets
