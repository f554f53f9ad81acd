#!/usr/bin/env bash
# Lead, session 6, call 2 (x2 host): where a replayed two-GPU step waits (--timeline), for the
# default batching and two settings; the 38.5 MB upload.
set -u
cd ../..
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune.json
mkdir -p /tmp/tr
zcat bench/traces/mirrored-cnn-2dev.trace.gz > /tmp/tr/m.trace
for e in X=default TFWGPU_BATCH_US=100 TFWGPU_BATCH_IDLE_US=50; do
  n=$(echo ${e%%=*}-${e#*=} | tr A-Z a-z)
  echo "== mirrored per-device $e"
  env $e timeout 60 $B replay /tmp/tr/m.trace --per-device --repeat 4 --json $OUT/mirrored-$n.json --timeline /tmp/tl-$n.jsonl 2>&1 | grep -E "steps|against"
  python3 bench/replay_timeline.py /tmp/tl-$n.jsonl --label 2gpu | head -70
done
gzip -c /tmp/tl-x-default.jsonl > $OUT/timeline-default.jsonl.gz
echo "== transfer"
timeout 60 $B transfer --mb 0.45,38.5 --reps 10 2>&1 | tail -8
