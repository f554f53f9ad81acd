#!/usr/bin/env bash
# mpg13 request 1 (one H200, ~50-60 s expected, at most ~150 s; no TensorFlow; every step under `timeout`). One binary
# (branch mpg13): TFWGPU_POOL_GATHER3S2=1 runs MaxPoolGrad's gather for 3x3 / 2 without top or
# left padding as pool_vec4.wgsl's MODE 7 (straight-line, every code position a constant, 2
# float16 round trips per 2 x 2 block instead of 9: 48 conversions per invocation instead of
# 104); unset = MODE 6 (main's, plus commit e7b279d: its sums start from a runtime +0, one
# conversion per invocation more). Same results bit for bit (tests/pool.rs,
# pool_gather3s2.rs on lavapipe); the bench's own rel err column must read the same for both.
# Binary: `.hostrun/tfwgpu-bench` built from main (the mpg13 merge d1e99d0 or later), release, stripped.
#
# Bytes (64x112x112x64; codes 1 byte per output element): float16 codes pass 115.6 MB (x 102.8
# read, codes 12.8 written), gather 141.3 MB (codes 12.8 + grads 25.7 read, dx 102.8 written);
# float32 codes 218.4 MB, gather 269.8 MB. Floors at session 11's copy (3732 GB/s span): float16
# codes 31.0 us, gather 37.9 us; float32 gather 72.3 us.
#
# PREDICTION (written before the run), per-pass "gpu per run" figures, us:
# - float16 gather (max_vec4/7 against max_vec4/6): 73 -> 45 (range 40-55), i.e. 1.9 -> ~3.1
#   TB/s (~84% of copy), if the gather is instruction-bound (its float32 twin, same
#   invocations and loads, runs at 3.46 TB/s = 93% of copy; the float16 one spends its time
#   in the half round trips: 104 conversions per invocation). MaxPoolGrad float16 span
#   139 -> ~111 us (49% -> ~62% of copy), wall 121 -> ~93 (53% -> ~68%); codes pass unchanged
#   (55 us).
# - float32 gather: 78 -> 72-78 (its floor is 72 at the copy's rate): within -8% / +3%.
# - Risk: mem7-3 measured fewer round trips SLOWER (89-90 us against 72, a runtime-flagged
#   skip inside MODE 6's loop); MODE 7 has no runtime-dependent branch between loads and stores.
#
# DECISION RULE: float16 gather faster by >= 10% in all three pairs and the rel err column
# equal -> MODE 7 the default for float16 (and for float32 if not slower there by > 2% in any
# pair); within +-5% -> the conversions are not the limit: the switch and MODE 7 are removed and
# the next suspect is the access pattern; slower -> removed, recorded.
#
# Files under $OUT: log.txt, results.json, smi.csv.
set -u
cd "$(dirname "$0")"
while [ ! -d .hostrun ] && [ "$PWD" != / ]; do cd ..; done
source .gl/activate.sh 2>/dev/null || true
B=./.hostrun/tfwgpu-bench
TR=$(ls bench/torch_ref.py torch_ref.py 2>/dev/null | head -1)
T=/tmp/mpg13; rm -rf $T; mkdir -p $T
P="${P:-maxpoolgrad3s2_64x112x112x64_f16,maxpoolgrad3s2_64x112x112x64}"
export TFWGPU_LOG=warn
export TFWGPU_TUNE_CACHE=/tmp/tune-mpg13.json
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
  step g3s2_1 "$P" TFWGPU_POOL_GATHER3S2=1
  step def1 "$P" X=1
  step def2 "$P" X=1
  step g3s2_2 "$P" TFWGPU_POOL_GATHER3S2=1
  step g3s2_3 "$P" TFWGPU_POOL_GATHER3S2=1
  step def3 "$P" X=1
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
