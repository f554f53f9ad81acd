#!/usr/bin/env bash
# The main job: set up, build, list the adapters and run the runtime demo on the best one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
cargo build --release -q -p tfwgpu-bench
./target/release/tfwgpu-bench devices
./target/release/tfwgpu-bench demo
