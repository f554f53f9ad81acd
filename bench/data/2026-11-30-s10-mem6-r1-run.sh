#!/usr/bin/env bash
# mem6 request 1 (at most ~230 s; every step under `timeout`). One binary (branch mem6):
# training batch norms (NHWC, C % 4 == 0) take statistics + per-channel results in ONE
# dispatch, the last workgroup to arrive finalizing (stats_last.wgsl), then the apply: two
# dispatches instead of three. A/B in the same call: TFWGPU_NORM_LAST=0 (main's three
# dispatches), TFWGPU_NORM_ONEPASS=0 on the rows that take the one-dispatch kernel (there:
# the new two dispatches against onepass), PyTorch on the same cases. Then default and
# LAST=0 again (repeat, for the spread). Files under $OUT: log.txt, results.json, smi.csv.
set -u
cd "$(dirname "$0")"
source .gl/activate.sh 2>/dev/null || true
B=./.hostrun/tfwgpu-bench
T=/tmp/mem6; rm -rf $T; mkdir -p $T
BN3="bn_train_64x56x56x256_f16,bn_grad_64x56x56x256_f16,bn_train_64x14x14x1024_f16,bn_grad_64x14x14x1024_f16,bn_grad_64x7x7x2048_f16,bn_train_64x14x14x1024,bn_grad_64x14x14x1024,bn_train_64x28x28x512,bn_grad_64x28x28x512,bn_train_64x56x56x256,bn_grad_64x56x56x256"
BN1="bn_train_32x14x14x256,bn_train_64x7x7x2048,bn_grad_64x7x7x2048,bn_train_64x7x7x2048_f16"
export TFWGPU_LOG=warn
export TFWGPU_TUNE_CACHE=/tmp/tune-mem6.json
timeout 235 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 &
SMI=$!
{
  date -u; timeout 5 $B devices 2>&1 | head -3
  echo "== new: default (two dispatches where three were)"; SECONDS=0
  timeout 60 $B ops --cases "$BN3,$BN1" --reps 5 --warm-ms 300 --json $T/new.json; echo "rc=$? (${SECONDS}s)"
  echo "== last0: TFWGPU_NORM_LAST=0 (three dispatches, main's)"; SECONDS=0
  TFWGPU_NORM_LAST=0 timeout 45 $B ops --one-copy --no-same-copy --cases "$BN3" --reps 5 --warm-ms 300 --json $T/last0.json; echo "rc=$? (${SECONDS}s)"
  echo "== op0: TFWGPU_NORM_ONEPASS=0 on the one-dispatch rows (new two dispatches)"; SECONDS=0
  TFWGPU_NORM_ONEPASS=0 timeout 20 $B ops --one-copy --no-same-copy --cases "$BN1" --reps 5 --warm-ms 300 --json $T/op0.json; echo "rc=$? (${SECONDS}s)"
  echo "== torch_ref.py"; SECONDS=0
  timeout 25 python3 torch_ref.py --cases "$BN3,$BN1" --reps 10 --json $T/torch.json; echo "rc=$? (${SECONDS}s)"
  echo "== new2: default again"; SECONDS=0
  timeout 35 $B ops --one-copy --no-same-copy --cases "$BN3" --reps 5 --warm-ms 200 --json $T/new2.json; echo "rc=$? (${SECONDS}s)"
  echo "== last0b: TFWGPU_NORM_LAST=0 again"; SECONDS=0
  TFWGPU_NORM_LAST=0 timeout 35 $B ops --one-copy --no-same-copy --cases "$BN3" --reps 5 --warm-ms 200 --json $T/last0b.json; echo "rc=$? (${SECONDS}s)"
  timeout 5 python3 - "$T" "$OUT/results.json" <<'PY'
import json, os, sys
t, out = sys.argv[1], sys.argv[2]
doc = {}
for k in ("new", "last0", "op0", "torch", "new2", "last0b"):
    p = os.path.join(t, k + ".json")
    if os.path.exists(p):
        with open(p) as f:
            doc[k] = json.load(f)
with open(out, "w") as f:
    json.dump(doc, f)
PY
  echo "== compare new"; timeout 3 python3 compare.py $T/new.json $T/torch.json
  date -u
} > "$OUT/log.txt" 2>&1
kill $SMI 2>/dev/null
tail -40 "$OUT/log.txt"
