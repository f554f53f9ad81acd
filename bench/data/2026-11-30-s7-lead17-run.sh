#!/usr/bin/env bash
# Lead, session 7, call 1 (x2 host): (1) float32 and float16 MatMul at 4096 alternated in one
# call with PyTorch (issue 6's 4x); (2) the two-GPU replay, first run on a fresh machine with
# both GPUs' clocks sampled, then host mirror on/off alternated (issue 8); (3) large uploads in
# pieces: transfer and the ResNet-50 replay with TFWGPU_UPLOAD_CHUNK_BYTES=0 / default
# alternated (issue 7).
set -u
cd ../..
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-l17.json
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
mkdir -p /tmp/tr
zcat bench/traces/mirrored-cnn-2dev.trace.gz > /tmp/tr/m.trace
zcat bench/traces/resnet50-b2to64-multi.trace.gz > /tmp/tr/r50m.trace
echo "== two GPUs, first run in this process tree, clocks of both GPUs sampled every 100 ms"
nvidia-smi --query-gpu=index,timestamp,clocks.sm,clocks.mem,power.draw,pstate --format=csv,noheader -lms 100 > $OUT/smi-first.csv 2>&1 &
SMI=$!
timeout 60 $B replay /tmp/tr/m.trace --per-device --repeat 5 --json /tmp/m-first.json 2>&1 | grep -E "steps \"[12]gpu|against"
kill $SMI
awk -F, '{print $1, $3}' $OUT/smi-first.csv | sort | uniq -c | sort -rn | head -8
run_m() { n=$1; shift; echo "== mirrored $n: $*"; env "$@" timeout 60 $B replay /tmp/tr/m.trace --per-device --repeat 5 --json /tmp/m-$n.json --timeline /tmp/tl-$n.jsonl 2>&1 | grep -E "steps \"[12]gpu|against"; python3 bench/replay_timeline.py /tmp/tl-$n.jsonl --label 2gpu | sed -n 2,4p; }
run_m mir1 X=1
run_m nomir1 TFWGPU_HOST_MIRROR_BYTES=0
run_m mir2 X=1
run_m nomir2 TFWGPU_HOST_MIRROR_BYTES=0
python3 bench/replay_timeline.py /tmp/tl-mir2.jsonl --label 2gpu > $OUT/timeline-mir2.txt
echo "== matmul f32 / f16 alternated, 4096"
for i in 1 2; do
  timeout 40 $B matmul --sizes 4096 --reps 5 --json /tmp/mm-f32-$i.json 2>&1 | tail -1
  timeout 40 $B matmul --dtype f16 --sizes 4096 --reps 5 --json /tmp/mm-f16-$i.json 2>&1 | tail -1
done
timeout 60 python3 bench/torch_ref.py --sizes 4096 --reps 5 --json /tmp/torch-mm.json 2>&1 | grep -i "4096" | head -4
echo "== uploads in pieces (38.5 MB): chunk 0 / 8 MiB default / 4 MiB, alternated"
for c in 0 default 4194304 0 default; do
  if [ $c = default ]; then e=X=1; else e=TFWGPU_UPLOAD_CHUNK_BYTES=$c; fi
  echo "-- $e"; env $e timeout 30 $B transfer --mb 38.5 --reps 10 2>&1 | tail -1
done
run_r() { n=$1; shift; echo "== r50 $n: $*"; env "$@" timeout 100 $B replay /tmp/tr/r50m.trace --repeat 3 --json /tmp/r50-$n.json > /tmp/r50-$n.log 2>&1; grep -E "steps \"train_step\"|idle \(medians\)" /tmp/r50-$n.log | grep -v "train_step_end" | head -3; grep -A 3 "longest idle stretches between batches in its last step" /tmp/r50-$n.log | sed -n 1,4p; }
run_r chunk0a TFWGPU_UPLOAD_CHUNK_BYTES=0
run_r chunk8a X=1
run_r chunk0b TFWGPU_UPLOAD_CHUNK_BYTES=0
run_r chunk8b X=1
cd /tmp && tar czf $OUT/json.tar.gz m-*.json mm-*.json torch-mm.json r50-*.json 2>/dev/null; ls $OUT
