#!/usr/bin/env bash
# dual11 request 2 (issue 8). Request 1 found: the H200 driver (580.159.04) imports host memory
# (VK_EXT_external_memory_host) but offers no SYNC_FD semaphores, so `--allreduce peer` ordered
# each bucket on the host. New here: (a) peer ordered on the GPUs by flags in the shared memory
# (TFWGPU_PEER_ORDER=flag: the source's queue stores a flag after its copies, the
# destination's queue polls it in a one-invocation shader; no semaphore, no host wait), checked
# (--check) at the start and the end; (b) peer's host-ordered fallback no longer blocks the
# recording thread (consumers held back until the source's batch completed); (c) interleaved
# rounds: exchange, peer (host-ordered), peer-flag, none; (d) the runtime's peer test binary on
# two real GPUs (GPU-side flag wait queued before the flag's store).
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
source .gl/activate.sh
gunzip -f .hostrun/*.gz 2>/dev/null
chmod +x .hostrun/*; B=$PWD/.hostrun/tfwgpu-bench
J=$OUT/json; mkdir -p $J
NG=$(nvidia-smi -L | wc -l)
nvidia-smi -L
if [ "$NG" -lt 2 ]; then
  echo "!! ONLY $NG GPU: two logical devices on one H200 (TFWGPU_VISIBLE_DEVICES=0,0): NOT two-GPU scaling"
  export TFWGPU_VISIBLE_DEVICES=0,0
fi
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
nvidia-smi --query-gpu=timestamp,index,clocks.sm,utilization.gpu --format=csv,noheader -lms 200 > $OUT/clocks.csv 2>/dev/null &
SMI=$!
echo "-- runtime peer test (two logical devices of GPU 0)"
TFWGPU_VISIBLE_DEVICES=0 timeout 60 .hostrun/peer-test --nocapture > $OUT/peer-test.log 2>&1; echo "rc=$?" >> $OUT/peer-test.log
grep -E "^test |test result|panicked|SKIP" $OUT/peer-test.log
zcat bench/traces/mirrored-cnn-2dev.trace.gz > /tmp/dual11.trace
dp() {  # name limit args...
  local name=$1 lim=$2; shift 2
  left $((225 - lim)) || { echo "(time: skipped dp $name)"; return; }
  echo "-- dp $name $(date +%T)"
  env ${DPENV:-} timeout $lim $B replay /tmp/dual11.trace --data-parallel ${DPN:-1,2} --per-device-batch 256 \
    --json $J/dp-$name.json "$@" > $OUT/dp-$name.log 2>&1
  echo "rc=$?" >> $OUT/dp-$name.log
  grep -vE '^adapter|^  device [01]:|^wrote|intervals between|^trace ' $OUT/dp-$name.log
}
FLAG='TFWGPU_PEER=1 TFWGPU_PEER_ORDER=flag'
DPENV=$FLAG dp check-flag 40 --allreduce peer --check --repeat 1
DPENV=TFWGPU_PEER=1 dp check-host 40 --allreduce peer --check --repeat 1
DPENV=$FLAG dp warmup 20 --repeat 2 --allreduce peer
for r in a b c d e; do
  dp exchange-$r 20 --repeat 11
  DPENV=$FLAG dp flag-$r 20 --allreduce peer --repeat 11
  DPENV=TFWGPU_PEER=1 dp host-$r 20 --allreduce peer --repeat 11
  dp none-$r 20 --allreduce none --repeat 11
done
DPENV=$FLAG dp check-flag-end 40 --allreduce peer --check --repeat 1
DPENV=$FLAG dp flag-bucket1 20 --allreduce peer --repeat 11 --bucket-kb 1
kill $SMI 2>/dev/null
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s), $NG GPU(s)"
grep -h "test result\|panicked" $OUT/peer-test.log
grep -h "check (2 devices)\|FALLBACK\|ordered on the GPUs\|rc=[1-9]\|rror\|gave up" $OUT/dp-check-*.log
for f in $J/dp-*.json; do python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = {x["devices"]: x for x in d["runs"]}
one, two = r.get(1), r.get(2)
if one and two:
    pd = two.get("per_device", [])
    hw = sum((p.get("peer_host_waits") or 0) for p in pd)
    fw = sum((p.get("peer_flag_waits") or 0) for p in pd)
    sub = sum((p.get("submits") or 0) for p in pd)
    print(f'{sys.argv[1].split("/")[-1]:20s} {d["allreduce"]:8s} 1 GPU {one["step_median_ms"]:.3f} ms | 2 GPUs {two["step_median_ms"]:.3f} ms {two["images_per_s"]:.0f}/s = {two["vs_one"]:.2f}x, blocked {two["allreduce_wait_ms_per_step"]:.3f} ms, host-ordered {hw}, flag waits {fw}, submits/pass {sub}')
PY
done
