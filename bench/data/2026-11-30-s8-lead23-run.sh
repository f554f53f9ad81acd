#!/usr/bin/env bash
# Lead, session 8, final call (x2 host, TF staged): the merged tree (host8, mem4, conv16, dual8,
# the lead's per-pass timing and upload submit). Keras CNN end to end with PyTorch in the same
# call, new defaults against main's old behaviour alternated (issue 7); two H200s with
# MirroredStrategy (issue 8); ResNet-50 replay GPU busy per pass (issue 7).
set -u
cd ../..
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-l23.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
echo "== torch cnn like for like $(date +%T)"
timeout 30 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 3 --json $OUT/torch-keraslike.json 2>&1 | tail -3
echo "== keras cnn: new / old alternated $(date +%T)"
OLD="TFWGPU_SYNC=completed TFWGPU_PIN_SEEDS=0 TFWGPU_ARENA_UPLOAD_BYTES=0"
bash bench/gpu_host.sh run "for r in 1 2; do echo new; timeout 25 python3 bench/keras_models.py --models cnn --steps 300 --warmup 10 --json \$OUT/keras-cnn-new-\$r.json 2>&1 | grep batch; echo old; $OLD timeout 25 python3 bench/keras_models.py --models cnn --steps 300 --warmup 10 --json \$OUT/keras-cnn-old-\$r.json 2>&1 | grep batch; done"
echo "== two H200s $(date +%T)"
bash bench/gpu_host.sh run 'timeout 45 python3 bench/mirrored.py --per-gpu-batch 256 --steps 150 --json $OUT/mirrored.json 2>&1 | grep -E "images_per_s\"|speedup|step_ms_median"; timeout 30 python3 bench/mirrored.py --per-gpu-batch 256 --steps 150 --only all --cross-device-ops one_device --json $OUT/mirrored-1d.json 2>&1 | grep -E "images_per_s\"|step_ms_median"'
echo "== r50 replay $(date +%T)"
gzip -dc bench/traces/resnet50-b2to64-reduce.trace.gz > /tmp/rf.trace
timeout 50 $B replay /tmp/rf.trace --repeat 4 --top 30 --json $OUT/r50.json > /tmp/r50.log 2>&1
grep -E 'wall median|host time in the pass|steps "train_step"|GPU \(timestamps around each compute' /tmp/r50.log | head -8
grep -A4 'steps "train_step" (timed per pass)' /tmp/r50.log | head -5
echo "== done $(date +%T)"; ls $OUT
