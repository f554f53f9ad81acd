#!/usr/bin/env bash
# Lead, session 6: float32 MatMul 4096 ran at 31.8-34.4 TFLOP/s in the merged tree against
# mm32's 42.97 with the same kernels: which runtime setting? Then the two-GPU replay with the
# warm-up.
set -u
cd ../..
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-16.json
OLD="TFWGPU_SPIN_US=0 TFWGPU_UPLOAD_POOL=0 TFWGPU_BATCH_IDLE_US=0"
for e in X=1 "$OLD" TFWGPU_UPLOAD_POOL=0 TFWGPU_BATCH_IDLE_US=0 X=1 "$OLD"; do
  echo "-- f32 $e"; env $e timeout 30 $B matmul --sizes 4096 --reps 5 --tiles auto,128x256x8_8x16h 2>&1 | grep -E "^ +4096"
done
zcat bench/traces/mirrored-cnn-2dev.trace.gz > /tmp/m.trace
for k in 1 2; do echo "-- per-device $k"; timeout 40 $B replay /tmp/m.trace --per-device --repeat 4 2>&1 | grep -E "steps \"[12]gpu|against"; done
