#!/usr/bin/env bash
# Lead, issue 8: MirroredStrategy scaling on two H200s, asynchronous vs blocking cross copies.
# Runs after install-tf, through bench/gpu_host.sh run.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for mode in async blocking; do
  for b in 256; do
    if [ $mode = blocking ]; then export TFWGPU_CROSS_COPIES=blocking; else unset TFWGPU_CROSS_COPIES; fi
    timeout 170 python3 bench/mirrored.py --per-gpu-batch $b --steps 60 --json $OUT/mirrored-$mode-$b.json 2>&1 | grep -v "^W0000\|^I0000" | tail -25
  done
done
