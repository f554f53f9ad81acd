#!/usr/bin/env bash
# Session 18, request 3 (issue 7), on main with the idle-age rule off (session 18's request 2):
# 1. bench/infer_interleaved.py: Keras CNN inference on tfwgpu and PyTorch's on CUDA in one
#    process, blocks alternating, SM clock sampled every 20 ms. Questions: the keras/torch ratio
#    on the same host and the same stretch of clock (goal <= 1.3x); whether the 2x spread of the
#    Keras blocks follows the SM clock. PREDICTION (before the run): keras 0.25-0.45 ms/call,
#    torch 0.18-0.28; per-round ratio median 1.2-1.8x; Keras blocks at < 1000 MHz median clock
#    >= 1.3x slower than those at 1980 MHz, torch's blocks less affected (its GPU part per call
#    is shorter... not known: PyTorch's cuDNN kernels at batch 64 were not timed here).
# 2. bench/models_table.py: the table (replay, Keras end to end, PyTorch f32/TF32/f16)
#    for mlp, cnn, resnet, resnet50 with the new default.
set -u
T0=$(date +%s)
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh
gunzip -f .hostrun/*.gz 2>/dev/null; chmod +x .hostrun/*
export TFWGPU_TUNE_CACHE=/tmp/tune-s18.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
for k in 1 2; do
  echo "-- interleaved $k $(date +%T)"
  bash bench/gpu_host.sh run "timeout 150 python3 bench/infer_interleaved.py --calls 300 --rounds 12 --json $L/interleaved-$k.json 2>&1 | grep -E '^round|^medians'"
done
echo "-- models table $(date +%T)"
bash bench/gpu_host.sh run "timeout 400 python3 bench/models_table.py --bench ./.hostrun/tfwgpu-bench --repeat 5 --json $L/table.json --keep $L/table-raw > $L/table.txt 2>&1; tail -30 $L/table.txt"
echo "== done $(date +%T) ($(( $(date +%s) - T0 )) s)"
tar czf $OUT/s18-infer-r3-logs.tgz -C $OUT logs && rm -rf $L
