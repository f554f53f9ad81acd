#!/usr/bin/env bash
# Issue 8 diagnosis on two GPUs (run through bench/gpu_host.sh run, TF installed): does the
# second GPU's work overlap the first's (two processes, one GPU each, at the same time), and
# how do the two replicas' kernel calls spread over host threads (a traced MirroredStrategy
# run, summarized by bench/trace_threads.py).
set -u
b=${1:-256}
echo "== alone, GPU 0 then GPU 1"
for d in 0 1; do
  TFWGPU_VISIBLE_DEVICES=$d timeout 100 python3 bench/mirrored.py --per-gpu-batch $b --steps 40 2>&1 | grep images_per_s
done
echo "== together: two processes, one GPU each"
TFWGPU_VISIBLE_DEVICES=0 timeout 100 python3 bench/mirrored.py --per-gpu-batch $b --steps 40 > /tmp/p0.log 2>&1 &
TFWGPU_VISIBLE_DEVICES=1 timeout 100 python3 bench/mirrored.py --per-gpu-batch $b --steps 40 > /tmp/p1.log 2>&1 &
wait
grep -h images_per_s /tmp/p0.log /tmp/p1.log
echo "== traced MirroredStrategy run"
TFWGPU_TRACE=/tmp/mirrored.trace timeout 150 python3 bench/mirrored.py --per-gpu-batch $b --steps 30 2>&1 | grep -E "images_per_s|speedup"
python3 bench/trace_threads.py /tmp/mirrored.trace --json $OUT/trace-threads.json
gzip -c /tmp/mirrored.trace > $OUT/mirrored-h200x2.trace.gz
ls -la $OUT
