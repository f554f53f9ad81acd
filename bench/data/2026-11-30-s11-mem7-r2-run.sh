#!/usr/bin/env bash
# mem7 request 2 (~150 s; every step under `timeout`). One binary (branch mem7, native half
# comparisons for float16 MaxPool and the argmax codes now the default, behind a self-test):
# - ref: the default with all copies and same-size copies, every pool and batch-norm row of
#   the issue's table, the small copies (the per-dispatch floor);
# - float16 pool A/B, interleaved twice: default (native, compare-and-select),
#   TFWGPU_POOL_F16_NATIVE=0 (widened, main's), =max (MaxPool by the built-in max),
#   TFWGPU_POOL_F16X8=1 (eight channels per invocation, native); the first with TFWGPU_LOG=info
#   (the native self-test's line: comparisons exact? how many half sums differ?);
# - PyTorch on the same rows and the small copies.
# Files under $OUT: log.txt, results.json, smi.csv.
set -u
cd "$(dirname "$0")"
source .gl/activate.sh 2>/dev/null || true
B=./.hostrun/tfwgpu-bench
T=/tmp/mem7; rm -rf $T; mkdir -p $T
P16="${P16:-maxpool3s2_64x112x112x64_f16,maxpoolgrad3s2_64x112x112x64_f16}"
P32="${P32:-maxpool3s2_64x112x112x64,maxpoolgrad3s2_64x112x112x64}"
BNA="${BNA:-bn_train_64x56x56x256_f16,bn_grad_64x56x56x256_f16,bn_train_64x14x14x1024_f16,bn_grad_64x14x14x1024_f16,bn_grad_64x7x7x2048_f16,bn_train_64x7x7x2048_f16,bn_train_64x14x14x1024,bn_grad_64x14x14x1024,bn_train_64x56x56x256,bn_grad_64x56x56x256,bn_train_64x28x28x512,bn_grad_64x28x28x512,bn_train_32x14x14x256,bn_train_64x7x7x2048,bn_grad_64x7x7x2048}"
FLOOR="${FLOOR:-copy_vec4x4_4KiB,copy_vec4x4_256KiB,copy_vec4x4_2MiB}"
TFLOOR="${TFLOOR:-copy_4KiB,copy_256KiB,copy_2MiB}"
export TFWGPU_LOG=warn
export TFWGPU_TUNE_CACHE=/tmp/tune-mem7.json
timeout 235 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 &
SMI=$!
step() { # name timeout-s cases [VAR=value ...]
  local name=$1 to=$2 cases=$3; shift 3
  echo "== $name: $* ($cases)"; SECONDS=0
  env "$@" timeout "$to" $B ops ${SMALL:-} --one-copy --no-same-copy --cases "$cases" --reps 5 --warm-ms 200 --json $T/$name.json
  echo "rc=$? (${SECONDS}s)"
}
{
  date -u; timeout 5 $B devices 2>&1 | head -3
  step nat_info 14 "$P16" TFWGPU_LOG=info
  echo "== ref: default with all copies and same-size copies"; SECONDS=0
  timeout 75 $B ops ${SMALL:-} --cases "$FLOOR,$P16,$P32,$BNA" --reps 5 --warm-ms 300 --json $T/ref.json; echo "rc=$? (${SECONDS}s)"
  step wid1 12 "$P16" TFWGPU_POOL_F16_NATIVE=0
  step nat1 12 "$P16" TFWGPU_POOL_F16_NATIVE=1
  step max1 12 "$P16" TFWGPU_POOL_F16_NATIVE=max
  step x81 12 "$P16" TFWGPU_POOL_F16X8=1
  step wid2 12 "$P16" TFWGPU_POOL_F16_NATIVE=0
  step nat2 12 "$P16" TFWGPU_POOL_F16_NATIVE=1
  step max2 12 "$P16" TFWGPU_POOL_F16_NATIVE=max
  step x82 12 "$P16" TFWGPU_POOL_F16X8=1
  echo "== torch_ref.py"; SECONDS=0
  timeout 30 python3 torch_ref.py --cases "$TFLOOR,$P16,$P32,$BNA" --reps 10 --json $T/torch.json; echo "rc=$? (${SECONDS}s)"
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
grep -E "^== |native float16|^bn_|^maxpool|^copy|gpu per run|^rc=" "$OUT/log.txt" | tail -100
