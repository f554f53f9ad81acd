#!/usr/bin/env bash
# mem6 request 2 (at most ~230 s; every step under `timeout`). One binary (branch mem6), A/B of
# its switches in the same call, interleaved (default, variant, default, variant):
# - batch norm (two dispatches: stats_last + apply): TFWGPU_NORM_UNROLL=8 (eight rows per
#   loop iteration), TFWGPU_NORM_ORDER=split (statistics workgroups chunk-major),
#   TFWGPU_NORM_APPLY_X8=1 (float16 apply with eight channels), TFWGPU_NORM_GROUP=1000000
#   (one level of arrival groups), the first three together;
# - MaxPool / MaxPoolGrad: TFWGPU_POOL_PAIR=1 (two output rows per invocation);
# PyTorch on the pool cases. Files under $OUT: log.txt, results.json, smi.csv.
set -u
cd "$(dirname "$0")"
source .gl/activate.sh 2>/dev/null || true
B=./.hostrun/tfwgpu-bench
T=/tmp/mem6; rm -rf $T; mkdir -p $T
BNF16="${BNF16:-bn_train_64x56x56x256_f16,bn_grad_64x56x56x256_f16,bn_train_64x14x14x1024_f16,bn_grad_64x14x14x1024_f16,bn_grad_64x7x7x2048_f16}"
BNF32="${BNF32:-bn_train_64x56x56x256,bn_grad_64x56x56x256,bn_train_64x14x14x1024,bn_grad_64x14x14x1024}"
POOL="${POOL:-maxpool3s2_64x112x112x64_f16,maxpoolgrad3s2_64x112x112x64_f16,maxpool3s2_64x112x112x64,maxpoolgrad3s2_64x112x112x64}"
export TFWGPU_LOG=warn
export TFWGPU_TUNE_CACHE=/tmp/tune-mem6.json
timeout 235 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 &
SMI=$!
step() { # name timeout-s cases [VAR=value ...]
  local name=$1 to=$2 cases=$3; shift 3
  echo "== $name: $* ($cases)"; SECONDS=0
  env "$@" timeout "$to" $B ops --one-copy --no-same-copy --cases "$cases" --reps 5 --warm-ms 200 --json $T/$name.json
  echo "rc=$? (${SECONDS}s)"
}
{
  date -u; timeout 5 $B devices 2>&1 | head -3
  echo "== ref: default with all copies (the copy reference)"; SECONDS=0
  timeout 45 $B ops --cases "$BNF16,$POOL" --reps 5 --warm-ms 300 --json $T/ref.json; echo "rc=$? (${SECONDS}s)"
  step pool_pair1 15 "$POOL" TFWGPU_POOL_PAIR=1
  step pool_def1 15 "$POOL" TFWGPU_POOL_PAIR=0
  step pool_pair2 15 "$POOL" TFWGPU_POOL_PAIR=1
  step bn_def1 15 "$BNF16" TFWGPU_NORM_UNROLL=4
  step bn_u8 15 "$BNF16" TFWGPU_NORM_UNROLL=8
  step bn_split 15 "$BNF16" TFWGPU_NORM_ORDER=split
  step bn_ax8 15 "$BNF16" TFWGPU_NORM_APPLY_X8=1
  step bn_one 15 "$BNF16" TFWGPU_NORM_GROUP=1000000
  step bn_def2 15 "$BNF16" TFWGPU_NORM_UNROLL=4
  step bn_all 15 "$BNF16" TFWGPU_NORM_UNROLL=8 TFWGPU_NORM_ORDER=split TFWGPU_NORM_APPLY_X8=1
  step bn_split32 12 "$BNF32" TFWGPU_NORM_ORDER=split
  step bn_def32 12 "$BNF32" TFWGPU_NORM_ORDER=tile
  step bn_one32 12 "$BNF32" TFWGPU_NORM_GROUP=1000000
  echo "== torch_ref.py (pool)"; SECONDS=0
  timeout 12 python3 torch_ref.py --cases "$POOL" --reps 10 --json $T/torch.json; echo "rc=$? (${SECONDS}s)"
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
grep -E "^== |^bn_|^maxpool|gpu per run|^rc=|copy bandwidth" "$OUT/log.txt" | tail -80
