#!/usr/bin/env bash
# Lead, session 7, TF staged (x2 host): Keras end to end on main (host mirror; uploads from
# 64 KiB through the queue's staging via TFWGPU_DIRECT_UPLOAD_BYTES since this plugin predates
# that default) next to PyTorch in the same call; two H200s steady state.
set -u
cd ../..
export TFWGPU_TUNE_CACHE=/tmp/tune-l19.json
export TFWGPU_DIRECT_UPLOAD_BYTES=65536
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
echo "== torch (f32, channels_last, batch 64; pageable feed as a Keras program gets) $(date +%T)"
timeout 80 python3 bench/torch_models.py --models cnn,resnet50 --modes f32 --layouts channels_last --steps 30 --warmup 5 --feed pageable --json $OUT/torch-models.json 2>&1 | grep -E "train|infer" | head -8
echo "== keras small models $(date +%T)"
bash bench/gpu_host.sh run 'timeout 100 python3 bench/keras_models.py --models mlp,cnn,resnet --json $OUT/keras-small.json 2>&1 | grep batch'
echo "== keras resnet50 $(date +%T)"
bash bench/gpu_host.sh run 'timeout 150 python3 bench/keras_models.py --models resnet50 --resnet50-steps 10 --resnet50-warmup 3 --json $OUT/keras-r50.json 2>&1 | grep batch'
echo "== two H200s, steady state, mirror on / off $(date +%T)"
bash bench/gpu_host.sh run 'timeout 120 python3 bench/mirrored.py --per-gpu-batch 256 --steps 150 --json $OUT/mirrored.json 2>&1 | grep -E "images_per_s\"|speedup|step_ms"; TFWGPU_HOST_MIRROR_BYTES=0 timeout 120 python3 bench/mirrored.py --per-gpu-batch 256 --steps 150 --json $OUT/mirrored-nomirror.json 2>&1 | grep -E "images_per_s\"|speedup|step_ms"'
echo "== done $(date +%T)"; ls -la $OUT
