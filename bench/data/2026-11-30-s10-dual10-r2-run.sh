#!/usr/bin/env bash
# dual10 request 2 (issue 8): (a) Keras MirroredStrategy end to end, the plugin's default
# all-reduce (ReductionToOneDevice) against TFWGPU_MIRRORED_REDUCE=exchange (every GPU sums both
# replicas' gradients itself: one host round trip instead of two), alternated, each in its own
# process; (b) the runtime-level data-parallel replay (tfwgpu-bench replay --data-parallel 1,2)
# again, in the same call. Later steps are skipped when they would not fit in 230 s.
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
zcat bench/traces/mirrored-cnn-2dev.trace.gz > /tmp/dual10.trace
dp() {  # name limit args...
  local name=$1 lim=$2; shift 2
  left $((230 - lim)) || { echo "(time: skipped dp $name)"; return; }
  echo "-- dp $name $(date +%T)"
  env ${DPENV:-} timeout $lim $B replay /tmp/dual10.trace --data-parallel 1,2 --per-device-batch 256 \
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
dp warmup 20 --repeat 2
dp exchange-a 20 --repeat 11
dp none-a 20 --allreduce none --repeat 11
keras default-a 45 --
keras exchange-a 35 -- --only all --cross-device-ops exchange
dp bucket1-a 20 --repeat 11 --bucket-kb 1
DPENV=TFWGPU_SUBMIT_THREAD=1 dp subthread-a 20 --repeat 11
keras default-b 45 --
keras exchange-b 35 -- --only all --cross-device-ops exchange
dp exchange-b 20 --repeat 11
dp none-b 20 --allreduce none --repeat 11
kill $SMI 2>/dev/null
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s), $NG GPU(s)"
for f in $J/dp-*.json; do python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = {x["devices"]: x for x in d["runs"]}
one, two = r.get(1), r.get(2)
if one and two:
    print(f'{sys.argv[1].split("/")[-1]:26s} {d["allreduce"]:8s} defer={d.get("defer")} 1 GPU {one["step_median_ms"]:.3f} ms {one["images_per_s"]:.0f}/s | 2 GPUs {two["step_median_ms"]:.3f} ms {two["images_per_s"]:.0f}/s = {two["vs_one"]:.2f}x, blocked {two["allreduce_wait_ms_per_step"]:.3f} ms')
PY
done
for f in $J/keras-*.json; do python3 -c "
import json,sys; d=json.load(open('$f')); o=d.get('one',{}); a=d.get('all',{})
print('$(basename $f)', d.get('cross_device_ops'), 'one', round(o.get('step_ms_median',0),3) if o else '-', round(o.get('images_per_s',0)) if o else '-', '| all', round(a.get('step_ms_median',0),3) if a else '-', round(a.get('images_per_s',0)) if a else '-', 'speedup', round(d.get('speedup',0),2))" 2>&1; done
