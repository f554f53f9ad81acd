#!/usr/bin/env bash
# mem7 optional request 3 (~50 s): the one default of branch mem7 not measured on a GPU.
# float16 MaxPoolGrad's block gather without (default, commit 4d78620) and with
# (TFWGPU_POOL_FIRST_RT=1) the half round trip after each input's first gradient,
# interleaved three times. Prediction: gather 73 -> 60-65 us if conversion-bound, else +-3%.
# Files under $OUT: log.txt.
set -u
cd "$(dirname "$0")"
source .gl/activate.sh 2>/dev/null || true
B=./.hostrun/tfwgpu-bench
P16="${P16:-maxpoolgrad3s2_64x112x112x64_f16}"
export TFWGPU_LOG=warn TFWGPU_TUNE_CACHE=/tmp/tune-mem7.json
step() { local name=$1; shift; echo "== $name: $*"; SECONDS=0
  env "$@" timeout 12 $B ops ${SMALL:-} --one-copy --no-same-copy --cases "$P16" --reps 5 --warm-ms 200 --json /tmp/mem7-$name.json
  echo "rc=$? (${SECONDS}s)"; }
{
  date -u
  for i in 1 2 3; do step def$i X=1; step firstrt$i TFWGPU_POOL_FIRST_RT=1; done
  date -u
} > "$OUT/log.txt" 2>&1
grep -E "^== |^maxpool|gpu per run|^rc=" "$OUT/log.txt"
