#!/usr/bin/env bash
# mpg13 request 2 (one H200, ~60 s, no TensorFlow): the confirmation of request 1
# (bench/data/2026-12-01-s14-mpg13-r1) on the tree where MODE 7 is the default for 3x3 / 2
# (TFWGPU_POOL_GATHER3S2=0: MODE 6). Request 1 had one clean pair (float16 gather 47.3 us
# against 71.3; float32 73.6 against 75.8) and two runs of MODE 7 where the whole pass ran at a
# lower clock (the codes pass of the same run 2.1x and 3.8x slower); normalized by the codes
# pass of their own run, MODE 7 was 0.89-0.90 of it against MODE 6's 1.36 in all three.
# PREDICTION: float16 gather 45-50 us (default) against 70-72 (=0) in each clean pair; float32
# 72-75 against 75-77; the rel err column identical.
set -u
cd "$(dirname "$0")"
while [ ! -d .hostrun ] && [ "$PWD" != / ]; do cd ..; done
source .gl/activate.sh 2>/dev/null || true
B=./.hostrun/tfwgpu-bench
TR=$(ls bench/torch_ref.py torch_ref.py 2>/dev/null | head -1)
T=/tmp/mpg13b; rm -rf $T; mkdir -p $T
P="${P:-maxpoolgrad3s2_64x112x112x64_f16,maxpoolgrad3s2_64x112x112x64}"
export TFWGPU_LOG=warn
export TFWGPU_TUNE_CACHE=/tmp/tune-mpg13b.json
timeout 90 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 &
SMI=$!
step() { # name cases [VAR=value ...]
  local name=$1 cases=$2; shift 2
  echo "== $name: $* ($cases)"; SECONDS=0
  env "$@" timeout 20 $B ops ${SMALL:-} --one-copy --no-same-copy --cases "$cases" --reps 5 --warm-ms 200 --json $T/$name.json
  echo "rc=$? (${SECONDS}s)"
}
{
  date -u; timeout 5 $B devices 2>&1 | head -3
  # Interleaved ABBA: new, old, old, new, new, old.
  step new1 "$P" X=1
  step old1 "$P" TFWGPU_POOL_GATHER3S2=0
  step old2 "$P" TFWGPU_POOL_GATHER3S2=0
  step new2 "$P" X=1
  step new3 "$P" X=1
  step old3 "$P" TFWGPU_POOL_GATHER3S2=0
  echo "== torch_ref.py"; SECONDS=0
  timeout 20 python3 "$TR" --cases "$P" --reps 10 --json $T/torch.json; echo "rc=$? (${SECONDS}s)"
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
grep -E "^== |^maxpool|^copy|gpu per run|^rc=|rror" "$OUT/log.txt" | tail -80
