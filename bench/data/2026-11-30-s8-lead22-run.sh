#!/usr/bin/env bash
# Lead, session 8, batch 2: ResNet-50 replay, GPU busy per pass; the input upload's stall with
# its staging copy submitted at once (TFWGPU_UPLOAD_SUBMIT=1, new default) or with the next
# batch (=0, before), alternated; host time in uploads and waits.
set -u
cd ../..
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-l22.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
gzip -dc bench/traces/resnet50-b2to64-reduce.trace.gz > /tmp/rf.trace
timeout 25 $B replay /tmp/rf.trace --repeat 2 > /dev/null 2>&1  # warm: tune cache, clocks
for r in 1 2; do for u in 1 0; do
  echo "== r50 replay UPLOAD_SUBMIT=$u run $r $(date +%T)"
  TFWGPU_UPLOAD_SUBMIT=$u timeout 50 $B replay /tmp/rf.trace --repeat 4 --top 30 --json $OUT/r50-u$u-$r.json > /tmp/r50-$u-$r.log 2>&1
  grep -E 'wall median|host time in the pass|steps "train_step"|GPU \(timestamps around each compute' /tmp/r50-$u-$r.log | head -8
  grep -A4 'steps "train_step" (timed per pass)' /tmp/r50-$u-$r.log | head -5
done; done
echo "== done $(date +%T)"
