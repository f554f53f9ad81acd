#!/usr/bin/env bash
# Lead, session 9, batch 1: pooled upload staging buffers (TFWGPU_UPLOAD_POOL_BYTES, default
# 256 MiB; 0 = the queue's own staging per upload, main's behaviour). Transfer bench and the
# ResNet-50 replay's host time in the 38.5 MB input upload, pool on / off alternated.
set -u
cd ../..
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-l24.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
echo "== transfer on/off/on/off $(date +%T)"
for p in 268435456 0 268435456 0; do echo "-- pool $p"; TFWGPU_UPLOAD_POOL_BYTES=$p timeout 20 $B transfer --mb 0.2,0.8,38.5 --reps 20 2>&1 | grep MB; done
gzip -dc bench/traces/resnet50-b2to64-reduce.trace.gz > /tmp/rf.trace
for p in 268435456 0; do
  echo "== r50 replay pool $p $(date +%T)"
  TFWGPU_UPLOAD_POOL_BYTES=$p timeout 55 $B replay /tmp/rf.trace --repeat 3 --top 5 --json $OUT/r50-pool$p.json > /tmp/r50-$p.log 2>&1
  grep -E 'wall median|host time in the pass|steps "train_step"' /tmp/r50-$p.log | head -6
  grep -A4 'steps "train_step" (timed per pass)' /tmp/r50-$p.log | head -5
done
echo "== done $(date +%T)"
