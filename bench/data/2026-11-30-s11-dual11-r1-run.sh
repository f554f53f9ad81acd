#!/usr/bin/env bash
# dual11 request 1 (issue 8): GPU-to-GPU gradient exchange without the host in the loop.
# (1) which Vulkan extensions the H200 driver offers (tfwgpu-bench peerprobe);
# (2) --check of the new `--allreduce peer` (host memory imported into both devices with
#     VK_EXT_external_memory_host, ordering by SYNC_FD semaphores) on two GPUs;
# (3) the data-parallel replay, 1 and 2 GPUs, settings interleaved in their own processes:
#     exchange (host path, session 10), peer (new), peerhost (peer's shared memory, ordered by a
#     host wait: TFWGPU_PEER_ORDER=host), none (no all-reduce), 4 rounds;
# (4) why `none` is not 2x: the one-GPU replay in two processes at once (one per GPU) against
#     one process alone.
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
source .gl/activate.sh
gunzip -f .hostrun/*.gz 2>/dev/null
chmod +x .hostrun/tfwgpu-bench; B=$PWD/.hostrun/tfwgpu-bench
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
echo "-- peerprobe"
TFWGPU_PEER=1 timeout 20 $B peerprobe 2>&1 | tee $OUT/peerprobe.txt
TFWGPU_PEER=1 timeout 20 $B peerprobe --all > $OUT/peerprobe-all.txt 2>&1
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
DPENV=TFWGPU_PEER=1 dp check-peer 40 --allreduce peer --check --repeat 1
DPENV=TFWGPU_PEER=1 dp warmup 20 --repeat 2 --allreduce peer
for r in a b c d; do
  dp exchange-$r 20 --repeat 11
  DPENV=TFWGPU_PEER=1 dp peer-$r 20 --allreduce peer --repeat 11
  DPENV='TFWGPU_PEER=1 TFWGPU_PEER_ORDER=host' dp peerhost-$r 20 --allreduce peer --repeat 11
  dp none-$r 20 --allreduce none --repeat 11
done
DPENV=TFWGPU_PEER=1 dp check-peer-end 40 --allreduce peer --check --repeat 1
# Two processes at once, one GPU each, against one alone (the same one-GPU replay).
if left 190 && [ "$NG" -ge 2 ]; then
  for r in a b; do
    echo "-- solo-$r $(date +%T)"
    TFWGPU_VISIBLE_DEVICES=0 timeout 20 $B replay /tmp/dual11.trace --data-parallel 1 --per-device-batch 256 --repeat 11 --allreduce none --json $J/solo0-$r.json > $OUT/solo0-$r.log 2>&1
    echo "-- pair-$r $(date +%T)"
    TFWGPU_VISIBLE_DEVICES=0 timeout 25 $B replay /tmp/dual11.trace --data-parallel 1 --per-device-batch 256 --repeat 11 --allreduce none --json $J/pair0-$r.json > $OUT/pair0-$r.log 2>&1 &
    P0=$!
    TFWGPU_VISIBLE_DEVICES=1 timeout 25 $B replay /tmp/dual11.trace --data-parallel 1 --per-device-batch 256 --repeat 11 --allreduce none --json $J/pair1-$r.json > $OUT/pair1-$r.log 2>&1
    wait $P0
  done
fi
kill $SMI 2>/dev/null
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s), $NG GPU(s)"
# (summary printing as in the r2 script)
