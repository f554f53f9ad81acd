#!/usr/bin/env bash
# Issue 8: MirroredStrategy scaling on two H200s (bench/mirrored.py: 1 GPU, then 2), run through
# bench/gpu_host.sh run with TensorFlow installed. Each setting in its own process; the
# arguments are settings: "default", "blocking" (TFWGPU_CROSS_COPIES=blocking), "nofusion"
# (TFWGPU_FUSION=0).
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
b=${B:-256}
for mode in "${@:-default}"; do
  case $mode in
    blocking) env=(TFWGPU_CROSS_COPIES=blocking) ;;
    nofusion) env=(TFWGPU_FUSION=0) ;;
    *) env=() ;;
  esac
  echo "== $mode (per-GPU batch $b)"
  env "${env[@]}" timeout 170 python3 bench/mirrored.py --per-gpu-batch $b --steps ${S:-200} \
    --json $OUT/mirrored-$mode-$b.json 2>&1 | grep -E "images_per_s|speedup|step_ms_mean|before_first"
done
