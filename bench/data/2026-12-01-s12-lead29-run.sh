#!/usr/bin/env bash
# Lead, session 11, the merged tree's last GPU check (~90 s; no TensorFlow): the split-K MatMul
# (host12, default on GPUs) against the tiled kernels (TFWGPU_MATMUL_SPLITK=0) on the Keras CNN's
# Dense product (64 x 10 over K = 1152, checked against its reference) and a wider skinny
# product, with PyTorch's in the same call; float16 MaxPool / MaxPoolGrad with mem7's native half
# comparisons (default); the CNN trace replayed, split-K on and off, two rounds.
set -u
source .gl/activate.sh 2>/dev/null || true
B=.hostrun/tfwgpu-bench; L=$OUT/logs; mkdir -p $L
export TFWGPU_TUNE_CACHE=/tmp/tune-lead29.json TFWGPU_LOG=warn
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
MM=matmul_64x1152x10,matmul_64x2048x1000
zcat bench/traces/cnn.trace.gz > /tmp/cnn-lead29.trace
for r in 1 2; do
  for v in 1 0; do
    echo "== ops splitk=$v r$r $(date +%T)"
    TFWGPU_MATMUL_SPLITK=$v timeout 30 $B ops --cases $MM --reps 5 --json $L/ops-$v-$r.json 2>&1 | grep -E "matmul_|WRONG|rror"
    echo "== replay splitk=$v r$r $(date +%T)"
    TFWGPU_MATMUL_SPLITK=$v timeout 40 $B replay /tmp/cnn-lead29.trace --repeat 5 --json $L/replay-$v-$r.json > $L/replay-$v-$r.txt 2>&1
    echo "rc=$?"; grep -E "train_step|infer_step|busy" $L/replay-$v-$r.txt | head -6
  done
done
echo "== pools $(date +%T)"
timeout 40 $B ops --cases maxpool3s2_64x112x112x64_f16,maxpoolgrad3s2_64x112x112x64_f16 --reps 5 --json $L/pool.json 2>&1 | grep -E "pool|WRONG|rror|copy bandwidth"
echo "== torch $(date +%T)"
timeout 40 python3 bench/torch_ref.py --cases $MM --reps 10 2>&1 | grep -E "matmul|rror"
echo "== done $(date +%T)"
