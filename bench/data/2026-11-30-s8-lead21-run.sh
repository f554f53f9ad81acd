#!/usr/bin/env bash
# Lead, session 8, batch 1: GPU busy of the ResNet-50 replay timed per compute pass (new) next
# to per dispatch; the CNN replay likewise.
set -u
cd ../..
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-l21.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
gzip -dc bench/traces/resnet50-b2to64-reduce.trace.gz > /tmp/rf.trace
for r in 1 2; do
  echo "== r50 replay run $r $(date +%T)"
  timeout 60 $B replay /tmp/rf.trace --repeat 4 --top 30 --json $OUT/r50-$r.json > /tmp/r50-$r.log 2>&1
  grep -E 'wall median|dispatches by kernels|steps "train_step"|steps "infer_step"|GPU \(timestamps|idle \(medians|^      #' /tmp/r50-$r.log | head -40
done
echo "== uploads: threads 4 / 8 / 16 $(date +%T)"
for t in 4 8 16; do echo "threads $t"; TFWGPU_UPLOAD_THREADS=$t timeout 30 $B transfer 2>&1 | grep MB; done
echo "== r50 replay, 8 upload threads $(date +%T)"
TFWGPU_UPLOAD_THREADS=8 timeout 60 $B replay /tmp/rf.trace --repeat 4 --top 30 --json $OUT/r50-t8.json > /tmp/r50-t8.log 2>&1
grep -E 'wall median|steps "train_step"|idle \(medians|^      #' /tmp/r50-t8.log | head -24
echo "== cnn replay $(date +%T)"
gzip -dc bench/traces/cnn.trace.gz > /tmp/cnn.trace
timeout 40 $B replay /tmp/cnn.trace --repeat 5 --top 20 --json $OUT/cnn.json > /tmp/cnn.log 2>&1
grep -E 'wall median|dispatches by kernels|steps "|GPU \(timestamps|idle \(medians' /tmp/cnn.log | head -30
echo "== done $(date +%T)"
