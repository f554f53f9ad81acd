#!/usr/bin/env bash
# wg3 request 1 (issue 6; one H200, ~70 s, no TensorFlow). pool_vec4.wgsl's three-dimensional
# grid had workgroups of 256 invocations per row of items; ResNet's 56-column, 64-channel rows
# are 896 channel quads, so each row ran 4 workgroups with 128 of 1024 invocations idle (12.5%),
# in MaxPool, the argmax codes pass and the gathers. Now the size is chosen per row (the largest
# multiple of 32 in 128..256 with the fewest idle: 224 here); TFWGPU_POOL_WG3=256 keeps 256.
# PREDICTION (written before the run), per-pass GPU us (timestamps): float16 codes pass 52.5 ->
# 47-51, float16 gather (MODE 7) 47.0 -> 43-46, float32 codes 95 -> 86-93, float32 gather 73.6
# -> 68-73; MaxPoolGrad float16 62-65% -> 66-71% of copy by span; MaxPool within +-8%. If the
# passes are latency-bound with too few warps in flight, the gain approaches the idle share
# (12.5%); if bandwidth-bound (the copy's own 3.85 TB/s is not reached, so not by DRAM), less.
# DECISION: keep the per-row size if the float16 MaxPoolGrad span is lower in all three pairs;
# else TFWGPU_POOL_WG3 goes and 256 stays.
set -u
cd "$(dirname "$0")"
while [ ! -d .hostrun ] && [ "$PWD" != / ]; do cd ..; done
source .gl/activate.sh 2>/dev/null || true
gunzip -f .hostrun/*.gz 2>/dev/null; chmod +x .hostrun/* 2>/dev/null
B=./.hostrun/tfwgpu-bench
T=/tmp/wg3; rm -rf $T; mkdir -p $T
P="${P:-maxpoolgrad3s2_64x112x112x64_f16,maxpoolgrad3s2_64x112x112x64,maxpool3s2_64x112x112x64_f16,maxpool3s2_64x112x112x64}"
export TFWGPU_LOG=warn
export TFWGPU_TUNE_CACHE=/tmp/tune-wg3.json
timeout 120 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 &
SMI=$!
step() { # name [VAR=value ...]
  local name=$1; shift
  echo "== $name: $*"; SECONDS=0
  env "$@" timeout 25 $B ops --one-copy --no-same-copy --cases "$P" --reps 5 --warm-ms 300 --json $T/$name.json
  echo "rc=$? (${SECONDS}s)"
}
{
  date -u; timeout 5 $B devices 2>&1 | head -3
  step new1 X=1
  step old1 TFWGPU_POOL_WG3=256
  step old2 TFWGPU_POOL_WG3=256
  step new2 X=1
  step new3 X=1
  step old3 TFWGPU_POOL_WG3=256
  timeout 5 python3 - "$T" "$OUT/results.json" <<'PY'
import glob, json, os, sys
t, out = sys.argv[1], sys.argv[2]
doc = {}
for p in sorted(glob.glob(os.path.join(t, "*.json"))):
    with open(p) as f:
        doc[os.path.basename(p)[:-5]] = json.load(f)
with open(out, "w") as f:
    json.dump(doc, f)
PY
  date -u
} > "$OUT/log.txt" 2>&1
kill $SMI 2>/dev/null
grep -E "^== |^maxpool|gpu per run|^rc=|rror" "$OUT/log.txt" | tail -80
