#!/usr/bin/env bash
# Session 17 request 1 (issues 6 and 8), one H200, ~6 min, no TensorFlow.
# Carries .gl and .hostrun/{tfwgpu-bench,tfwgpu-bench-old}.gz: tfwgpu-bench is main at 70622c1;
# tfwgpu-bench-old is the same tree with crates/bench/src/replay_dp.rs of f7d5dfb (before the
# fix of 01aa97c), so the two differ only by the replay's waiting rule.
#
# Part A (issue 6): MaxPoolGrad's argmax codes two outputs per invocation (pool_vec4.wgsl MODE 8,
# default) against one (TFWGPU_POOL_CODES_PAIR=0, MODE 5), three interleaved pairs of processes.
# PREDICTION (written before the run), per-pass GPU us: float16 codes 52.9 -> 44-48 (15 loads
# for two outputs instead of 18, half the index arithmetic; session 14 put the pass at 2.46 TB/s
# on the window loads alone), float32 codes 90.4 -> 78-86; the gathers unchanged; MaxPoolGrad
# float16 63% -> 67-71% of the copy (span), float32 78% -> 80-84%.
# DECISION: MODE 8 stays the default if the float16 codes pass is faster in all three pairs.
#
# Part B (issue 8): the replay's exact-sum check (--check) on two logical devices of one H200
# (TFWGPU_VISIBLE_DEVICES=0,0), batch 256, peer and peer-host, new binary against old,
# interleaved, one process per check; exchange twice with the new binary.
# PREDICTION: new: every check exact; old: some peer / peer-host checks wrong (session 14 on one
# H200: peer-host 1 of 1 wrong; session 15 on two: peer 2 of 7), new none.
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
source .gl/activate.sh
gunzip -f .hostrun/*.gz 2>/dev/null
chmod +x .hostrun/*
B=./.hostrun/tfwgpu-bench
L=$OUT/logs; mkdir -p $L/ops $L/check
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 250 > $L/smi.csv 2>&1 &
SMI=$!
export TFWGPU_LOG=warn TFWGPU_TUNE_CACHE=/tmp/tune-s17.json
P="maxpoolgrad3s2_64x112x112x64_f16,maxpoolgrad3s2_64x112x112x64,maxpool3s2_64x112x112x64_f16,maxpool3s2_64x112x112x64"
step() { # name [VAR=value ...]
  local name=$1; shift
  echo "== $name: $*"; SECONDS=0
  env "$@" timeout 25 $B ops --one-copy --no-same-copy --cases "$P" --reps 5 --warm-ms 300 --json $L/ops/$name.json > $L/ops/$name.log 2>&1
  echo "rc=$? (${SECONDS}s)"
  grep -E "^maxpoolgrad|gpu per run|copy bandwidth" $L/ops/$name.log
}
echo "-- part A $(date +%T)"
step pair1 X=1
step one1 TFWGPU_POOL_CODES_PAIR=0
step one2 TFWGPU_POOL_CODES_PAIR=0
step pair2 X=1
step pair3 X=1
step one3 TFWGPU_POOL_CODES_PAIR=0
echo "-- part B $(date +%T)"
zcat bench/traces/mirrored-cnn-2dev.trace.gz > /tmp/s17.trace
chk() { # name binary mode
  left 540 || { echo "(time: skipped $1)"; return; }
  TFWGPU_PEER=1 TFWGPU_VISIBLE_DEVICES=0,0 timeout 30 $2 replay /tmp/s17.trace --data-parallel 2 \
    --per-device-batch 256 --allreduce $3 --check --repeat 1 > $L/check/$1.log 2>&1
  echo "rc=$?" >> $L/check/$1.log
}
for k in $(seq 1 ${N:-12}); do
  chk new-peer-$k $B peer
  chk old-peer-$k $B-old peer
  chk new-peerhost-$k $B peer-host
  chk old-peerhost-$k $B-old peer-host
done
chk new-exchange-1 $B exchange
chk new-exchange-2 $B exchange
kill $SMI 2>/dev/null
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s)"
for b in new old; do for m in peer peerhost exchange; do
  fs=$(ls $L/check/$b-$m-*.log 2>/dev/null); [ -z "$fs" ] && continue
  tot=$(echo "$fs" | wc -l); ok=$(grep -l "every device has the devices' sum" $fs | wc -l)
  echo "check $b $m: $ok of $tot exact"
  for f in $(grep -L "every device has the devices' sum" $fs); do echo "  $(basename $f): $(grep -hE 'rror|wrong|got another|panick|rc=' $f | head -3 | tr '\n' ' ')"; done
done; done
(cd $OUT && tar czf s17-r1.tar.gz logs && rm -rf logs)
