#!/usr/bin/env bash
# Lead, session 9, last call (one H200, TF staged): the idle rules no longer submit a batch of
# copies alone (default) against TFWGPU_BATCH_IDLE_TRANSFERS=1 (main's behaviour), Keras CNN
# with PyTorch like for like interleaved; two H200s with MirroredStrategy once if time is left.
set -u
cd ../..
export TFWGPU_TUNE_CACHE=/tmp/tune-l26.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
TK="timeout 25 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 1 --variants pageable+sync,infer"
KM="timeout 30 python3 bench/keras_models.py --models cnn --steps 300 --warmup 10"
for r in 1 2 3; do
  echo "-- torch $r"; $TK 2>&1 | grep -E "ms/step"
  bash bench/gpu_host.sh run "echo '-- keras default $r'; $KM --json \$OUT/keras-cnn-$r.json 2>&1 | grep batch; echo '-- keras IDLE_TRANSFERS=1 $r'; TFWGPU_BATCH_IDLE_TRANSFERS=1 $KM --json \$OUT/keras-cnn-it1-$r.json 2>&1 | grep batch"
done
echo "-- host budget, default / IDLE_TRANSFERS=1"
bash bench/gpu_host.sh run "$KM --host-budget 1 2>&1 | grep -E 'h2d wall|ms/step \(in'; TFWGPU_BATCH_IDLE_TRANSFERS=1 $KM --host-budget 1 2>&1 | grep -E 'h2d wall|ms/step \(in'"
if left 150 && [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
echo "== two H200s, mirrored.py (default all-reduce) $(date +%T)"
bash bench/gpu_host.sh run "timeout 45 python3 bench/mirrored.py --per-gpu-batch 256 --steps 150 --json \$OUT/mirrored.json 2>&1 | grep -E 'images_per_s\"|speedup|step_ms_median'"
fi
echo "== done $(date +%T)"
