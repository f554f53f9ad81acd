#!/usr/bin/env bash
# Lead, session 12: the K split of the vector tile (branch ksplit) on ResNet-50's classifier
# products, A/B against TFWGPU_MATMUL_KSPLIT=0 in the same binary, interleaved, with PyTorch.
# Prediction: 64x2048x1000 87.7 -> 15-25 us (128 workgroups of 256 terms + a 1 MB sum),
# 64x1000x2048_tb (32 tiles, 2 parts) ~1.5-1.8x faster; other matmul rows unchanged.
set -u
source .gl/activate.sh 2>/dev/null || true
B=.hostrun/tfwgpu-bench; L=$OUT/logs; mkdir -p $L
export TFWGPU_LOG=warn
C=matmul_64x2048x1000,matmul_64x1000x2048_tb,matmul_64x1152x10,matmul_1024
for r in 1 2 3; do
  for v in 1 0; do
    echo "== ops ksplit=$v r$r $(date +%T)"
    TFWGPU_TUNE_CACHE=/tmp/tune-ks-$v-$r.json TFWGPU_MATMUL_KSPLIT=$v timeout 40 $B ops --cases $C --reps 5 --json $L/ops-$v-$r.json 2>&1 | grep -E "matmul_|WRONG|rror|gpu per run"
  done
done
echo "== torch $(date +%T)"
timeout 40 python3 bench/torch_ref.py --cases $C --reps 10 2>&1 | grep -E "matmul|rror"
echo "== done $(date +%T)"
