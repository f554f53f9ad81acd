#!/usr/bin/env bash
# Runs the kernel benchmark side by side on a CUDA GPU host (the H200): `tfwgpu-bench ops`
# (Vulkan), bench/torch_ref.py (PyTorch on CUDA, the same cases) and bench/compare.py.
#
#   BENCH=./tfwgpu-bench OUT=/tmp/out bash bench/h200_kernels.sh [extra tfwgpu-bench ops args]
#
# BENCH: the release tfwgpu-bench binary (default: ./tfwgpu-bench beside this script, else
# target/release/tfwgpu-bench). OUT: where ours.json and torch.json go (default
# .). CASES: a comma-separated case list for both sides (default: all). Each step has its own
# time limit so the whole run stays under 4 minutes on the H200.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
BENCH="${BENCH:-}"
if [ -z "$BENCH" ]; then
  if [ -x "$here/tfwgpu-bench" ]; then BENCH="$here/tfwgpu-bench"; else BENCH="$here/../target/release/tfwgpu-bench"; fi
fi
OUT="${OUT:-.}"
CASES="${CASES:-all}"
mkdir -p "$OUT"
"$BENCH" devices 2>&1 | head -12
echo "== tfwgpu-bench ops (cases: $CASES)"
timeout 150 "$BENCH" ops --cases "$CASES" --reps 5 --json "$OUT/ours.json" "$@"
echo "rc=$?"
echo "== torch_ref.py"
timeout 70 python3 "$here/torch_ref.py" --cases "$CASES" --reps 10 --json "$OUT/torch.json"
echo "rc=$?"
echo "== compare"
python3 "$here/compare.py" "$OUT/ours.json" "$OUT/torch.json"
