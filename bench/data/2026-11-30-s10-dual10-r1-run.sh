#!/usr/bin/env bash
# dual10 request 1 (issue 8): data-parallel CNN training at the runtime level
# (`tfwgpu-bench replay TRACE --data-parallel 1,2`: each GPU replays the one-GPU Keras CNN step
# at batch 256 on its own thread; the 8 weight gradients (225,034 float32 = 900 KB per step) are
# all-reduced in 4 buckets through the host while the backward pass goes on; the optimizer of a
# gradient waits for its sum; events waiting for it held back, or --no-defer: the thread blocks),
# exchange vs halves alternated; the ring trace replayed per
# device (TF's own graph) with a timeline; `--allreduce none` (the GPUs train apart: the ceiling); Keras MirroredStrategy end to end (mirrored.py).
# Every step under timeout; later steps skipped when they would not fit in 230 s.
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
source .gl/activate.sh
gunzip -f .hostrun/*.gz
chmod +x .hostrun/tfwgpu-bench; B=.hostrun/tfwgpu-bench
J=$OUT/json; mkdir -p $J
NG=$(nvidia-smi -L | wc -l)
nvidia-smi -L
if [ "$NG" -lt 2 ]; then
  echo "!! ONLY $NG GPU: two logical devices on one H200 (TFWGPU_VISIBLE_DEVICES=0,0): the figures show the plumbing's cost, NOT two-GPU scaling"
  export TFWGPU_VISIBLE_DEVICES=0,0
fi
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
nvidia-smi --query-gpu=timestamp,index,clocks.sm,utilization.gpu --format=csv,noheader -lms 200 > $OUT/clocks.csv 2>/dev/null &
SMI=$!
timeout 10 $B devices 2>&1 | head -4
if [ -n "${DP_TRACE:-}" ]; then cp "$DP_TRACE" /tmp/dual10.trace; else zcat bench/traces/mirrored-cnn-2dev.trace.gz > /tmp/dual10.trace; fi
dp() {  # name limit args...
  local name=$1 lim=$2; shift 2
  left $((230 - lim)) || { echo "(time: skipped dp $name)"; return; }
  echo "-- dp $name $(date +%T)"
  timeout $lim $B replay /tmp/dual10.trace --data-parallel 1,2 --per-device-batch 256 \
    --json $J/dp-$name.json "$@" 2>&1 | grep -vE '^adapter|^  device [01]:|^wrote|intervals between'
}
keras() {  # name limit env... -- args...
  local name=$1 lim=$2; shift 2
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  left $((230 - lim)) || { echo "(time: skipped keras $name)"; return; }
  echo "-- keras $name $(date +%T)"
  env "${envs[@]}" TFWGPU_TUNE_CACHE=/tmp/tune-dual10.json timeout $lim bash bench/gpu_host.sh run \
    "python3 bench/mirrored.py --per-gpu-batch 256 --steps 150 --json $J/keras-$name.json $*" 2>&1 \
    | grep -E '"images_per_s"|step_ms_median|"speedup"|Error|error' | tr -s ' ' | tr '\n' ' '; echo
}
dp check-exchange 30 --repeat 1 --check
dp exchange-a 25 --repeat 9
dp none-a 25 --allreduce none --repeat 9
dp exchange-nodefer-a 25 --repeat 9 --no-defer
dp halves-a 25 --allreduce halves --repeat 9
dp exchange-b 25 --repeat 9
dp exchange-nodefer-b 25 --repeat 9 --no-defer
dp halves-b 25 --allreduce halves --repeat 9
if left 200; then
  echo "-- ring trace per device (TF's MirroredStrategy graph), timeline $(date +%T)"
  timeout 25 $B replay /tmp/dual10.trace --per-device --repeat 5 --json $J/ring.json \
    --timeline $J/ring-timeline.jsonl 2>&1 | grep -E "wall median|against|steps"
  timeout 10 python3 bench/replay_timeline.py $J/ring-timeline.jsonl --label 2gpu > $J/ring-timeline.txt 2>&1
  timeout 10 python3 bench/replay_timeline.py $J/ring-timeline.jsonl --label 1gpu > $J/ring-timeline-1gpu.txt 2>&1
  head -12 $J/ring-timeline.txt
fi
keras default-a 45 --
dp exchange-c 25 --repeat 9
keras default-b 45 --
keras pack128k 30 -- --only all --cross-device-ops collective --bytes-per-pack 131072
dp check-halves 30 --allreduce halves --repeat 1 --check
kill $SMI 2>/dev/null
gzip -f $J/ring-timeline.jsonl 2>/dev/null
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s), $NG GPU(s)"
for f in $J/dp-*.json; do python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = {x["devices"]: x for x in d["runs"]}
one, two = r.get(1), r.get(2)
if one and two:
    print(f'{sys.argv[1].split("/")[-1]:24s} {d["allreduce"]:8s} 1 GPU {one["step_median_ms"]:.3f} ms {one["images_per_s"]:.0f}/s | 2 GPUs {two["step_median_ms"]:.3f} ms {two["images_per_s"]:.0f}/s = {two["vs_one"]:.2f}x, wait {two["allreduce_wait_ms_per_step"]:.3f} ms')
PY
done
for f in $J/keras-*.json; do python3 -c "
import json,sys; d=json.load(open('$f')); o=d.get('one',{}); a=d.get('all',{})
print('$(basename $f)', 'one', round(o.get('step_ms_median',0),3) if o else '-', 'all', round(a.get('step_ms_median',0),3) if a else '-', 'speedup', round(d.get('speedup',0),2))" 2>&1; done
