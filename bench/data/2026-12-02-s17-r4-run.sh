#!/usr/bin/env bash
# Session 17 request 4 (issue 6), one H200, ~90 s, no TensorFlow. Carries .gl and
# .hostrun/tfwgpu-bench.gz (main at 65050de + MODE 9, uncommitted when built).
# MODE 9: MaxPoolGrad's float16 argmax codes (3x3 / 2, half arithmetic) from a band of the
# input staged in workgroup memory: a workgroup of 224 channel-quad items covers 4 output rows,
# loads its 9 x 29-column band once (4176 quads: 4.7 global loads per output instead of 9), a
# barrier, then each window's 9 elements from workgroup memory. TFWGPU_POOL_CODES_BAND=0: MODE 5.
# Requests 1 and 2 showed fewer loads per invocation do not pay when they cost registers; here
# the loads leave the invocation's registers (staged in workgroup memory).
# PREDICTION (written before the run): float16 codes 52.8 -> 44-50 us if the overlapping global
# loads (2.25 per element, through L1/L2) are what holds the pass; no gain (or a loss, from the
# barrier and the integer divisions of the band loads) if it is the compare-select chain and the
# store. float32 untouched (MODE 5 in both arms).
# DECISION: MODE 9 stays the default if the float16 codes pass is faster in all three pairs.
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
step band1 X=1
step one1 TFWGPU_POOL_CODES_BAND=0
step one2 TFWGPU_POOL_CODES_BAND=0
step band2 X=1
step band3 X=1
step one3 TFWGPU_POOL_CODES_BAND=0
kill $SMI 2>/dev/null
(cd $OUT && tar czf s17-r4.tar.gz logs && rm -rf logs)
