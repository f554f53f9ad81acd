#!/usr/bin/env bash
# Lead, session 7, call 2 (x2 host, HEAD with the host mirror and byte-masked tails): uploads of
# 64 KiB-1 MiB through the queue's staging (TFWGPU_DIRECT_UPLOAD_BYTES=65536) against the
# default (1 MiB), alternated: transfer, the one-GPU CNN replay, the two-GPU replay; the
# ResNet-50 replay's timed pass without timing-slot creation inside it.
set -u
cd ../..
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-l18.json
mkdir -p /tmp/tr
zcat bench/traces/mirrored-cnn-2dev.trace.gz > /tmp/tr/m.trace
zcat bench/traces/cnn.trace.gz > /tmp/tr/cnn.trace
# Warm both GPUs' clocks with a first run whose figures are not used.
timeout 60 $B replay /tmp/tr/m.trace --per-device --repeat 2 > /dev/null 2>&1
for i in 1 2; do for d in 1048576 65536; do
  echo "== transfer direct>=$d"; TFWGPU_DIRECT_UPLOAD_BYTES=$d timeout 30 $B transfer --mb 0.2,0.8 --reps 20 2>&1 | tail -2
  echo "== cnn replay direct>=$d"; TFWGPU_DIRECT_UPLOAD_BYTES=$d timeout 60 $B replay /tmp/tr/cnn.trace --repeat 4 --json /tmp/cnn-$d-$i.json 2>&1 | grep -E "steps \"(train|infer)_step\":"
  echo "== mirrored direct>=$d"; TFWGPU_DIRECT_UPLOAD_BYTES=$d timeout 60 $B replay /tmp/tr/m.trace --per-device --repeat 4 --json /tmp/m-$d-$i.json --timeline /tmp/tl-$d-$i.jsonl 2>&1 | grep -E "steps \"[12]gpu|against"
  python3 bench/replay_timeline.py /tmp/tl-$d-$i.jsonl --label 2gpu | sed -n 1,4p
done; done
python3 bench/replay_timeline.py /tmp/tl-65536-2.jsonl --label 2gpu > $OUT/timeline-65536-2.txt
for i in 1; do for us in 50 20; do
  echo "== mirrored + cnn, TFWGPU_BATCH_IDLE_US=$us"; TFWGPU_BATCH_IDLE_US=$us timeout 60 $B replay /tmp/tr/m.trace --per-device --repeat 5 --json /tmp/m-idle$us-$i.json 2>&1 | grep -E "steps \"[12]gpu|against"
  TFWGPU_BATCH_IDLE_US=$us timeout 60 $B replay /tmp/tr/cnn.trace --repeat 5 --json /tmp/cnn-idle$us-$i.json 2>&1 | grep -E "steps \"(train|infer)_step\":"
done; done
echo "== r50 replay: the timed pass now runs twice and reports the second (timing slots made in the first)"
zcat bench/traces/resnet50-b2to64-multi.trace.gz > /tmp/tr/r50m.trace
timeout 150 $B replay /tmp/tr/r50m.trace --repeat 3 --json /tmp/r50.json > $OUT/r50.log 2>&1; echo "rc=$?"
grep -E "dispatches by kernels|steps \"train_step\"" -A1 $OUT/r50.log | head -8
cd /tmp && tar czf $OUT/json.tar.gz cnn-*.json m-*.json r50.json; ls $OUT
