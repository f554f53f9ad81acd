#!/usr/bin/env bash
# mem7 request 1 (~170 s; every step under `timeout`). One binary (branch mem7), A/B of its
# switches in the same call, interleaved (variant, default, variant, default):
# - float16 MaxPool / MaxPoolGrad: TFWGPU_POOL_F16_NATIVE=1 (whole 3x3 windows compared and the
#   block gather summed in half arithmetic, no widening) against the default (widened);
# - batch norm, two-level last arrivers: TFWGPU_NORM_LOADS4=1 (four record loads per lane
#   before the merge) against the default;
# - batch norm, the one-dispatch rows: TFWGPU_NORM_ONEPASS=0 (two dispatches) against the
#   default (one dispatch), a repeat of mem6's single run;
# - the dispatch floor: copies of 4 KiB / 256 KiB / 2 MiB (copy_vec4x4_*) in the ref run, and
#   PyTorch's copies of the same sizes, beside the small batch-norm rows.
# Files under $OUT: log.txt, results.json, smi.csv.
set -u
cd "$(dirname "$0")"
source .gl/activate.sh 2>/dev/null || true
B=./.hostrun/tfwgpu-bench
T=/tmp/mem7; rm -rf $T; mkdir -p $T
P16="${P16:-maxpool3s2_64x112x112x64_f16,maxpoolgrad3s2_64x112x112x64_f16}"
P32="${P32:-maxpool3s2_64x112x112x64,maxpoolgrad3s2_64x112x112x64}"
BNL="${BNL:-bn_train_64x56x56x256_f16,bn_grad_64x56x56x256_f16,bn_train_64x14x14x1024_f16,bn_grad_64x14x14x1024_f16,bn_train_64x14x14x1024,bn_grad_64x14x14x1024}"
BN1="${BN1:-bn_train_32x14x14x256,bn_train_64x7x7x2048,bn_grad_64x7x7x2048,bn_train_64x7x7x2048_f16}"
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
  echo "== ref: default with all copies and same-size copies (the copy reference, the floors)"; SECONDS=0
  timeout 55 $B ops ${SMALL:-} --cases "$FLOOR,$P16,$P32,$BNL,$BN1" --reps 5 --warm-ms 300 --json $T/ref.json; echo "rc=$? (${SECONDS}s)"
  step pool_nat1 14 "$P16" TFWGPU_POOL_F16_NATIVE=1
  step pool_def1 14 "$P16" TFWGPU_POOL_F16_NATIVE=0
  step pool_nat2 14 "$P16" TFWGPU_POOL_F16_NATIVE=1
  step pool_def2 14 "$P16" TFWGPU_POOL_F16_NATIVE=0
  step bn_l4_1 12 "$BNL" TFWGPU_NORM_LOADS4=1
  step bn_def1 12 "$BNL" TFWGPU_NORM_LOADS4=0
  step bn_l4_2 12 "$BNL" TFWGPU_NORM_LOADS4=1
  step bn_def2 12 "$BNL" TFWGPU_NORM_LOADS4=0
  step one_off1 10 "$BN1,$FLOOR" TFWGPU_NORM_ONEPASS=0
  step one_def1 10 "$BN1,$FLOOR" TFWGPU_NORM_ONEPASS=auto
  step one_off2 10 "$BN1,$FLOOR" TFWGPU_NORM_ONEPASS=0
  step one_def2 10 "$BN1,$FLOOR" TFWGPU_NORM_ONEPASS=auto
  echo "== torch_ref.py"; SECONDS=0
  timeout 25 python3 torch_ref.py --cases "$TFLOOR,$P16,$BNL,$BN1" --reps 10 --json $T/torch.json; echo "rc=$? (${SECONDS}s)"
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
grep -E "^== |^bn_|^maxpool|^copy|gpu per run|^rc=" "$OUT/log.txt" | tail -90
