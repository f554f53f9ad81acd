#!/usr/bin/env bash
# mem4 request 2 (at most 120 s; the lead's limit). Binaries: new (branch mem4 after request 1:
# MaxPoolGrad's gather per 2 x 2 block of inputs; float16 batch-norm statistics 32 rows per
# invocation and apply 4 vec4 per invocation; the one-dispatch batch norm only where request
# 1 measured it faster), main (main's binary, same cases), A/B runs of the new binary
# (TFWGPU_POOL_BLOCK_GATHER=0, TFWGPU_NORM_ROWS=16); PyTorch on the same cases. No same-size
# copies (request 1 measured them for these cases). Three files: log.txt, results.json, smi.csv.
set -u
cd "$(dirname "$0")"
T=/tmp/mem4; rm -rf $T; mkdir -p $T
for b in new main; do gunzip -c tfwgpu-bench-$b.gz > $T/$b && chmod +x $T/$b; done
ALL="maxpoolgrad3s2_64x112x112x64,maxpoolgrad3s2_64x112x112x64_f16,bn_train_64x56x56x256_f16,bn_grad_64x56x56x256_f16,bn_train_64x7x7x2048,bn_grad_64x7x7x2048,bn_train_64x7x7x2048_f16,bn_grad_64x7x7x2048_f16,bn_train_32x14x14x256"
export TFWGPU_LOG=warn,tfwgpu_runtime::kernels::f16conv=info
timeout 118 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 &
SMI=$!
{
  date -u; timeout 5 $T/new devices 2>&1 | head -4
  echo "== new: tfwgpu-bench ops (branch mem4)"; SECONDS=0
  timeout 34 $T/new ops --cases "$ALL" --reps 5 --warm-ms 300 --no-same-copy --json $T/new.json; echo "rc=$? (${SECONDS}s)"
  echo "== main: main's binary, same bench cases"; SECONDS=0
  timeout 30 $T/main ops --cases "$ALL" --reps 5 --warm-ms 300 --no-same-copy --json $T/main.json; echo "rc=$? (${SECONDS}s)"
  echo "== torch_ref.py"; SECONDS=0
  timeout 15 python3 torch_ref.py --cases "$ALL" --reps 5 --json $T/torch.json; echo "rc=$? (${SECONDS}s)"
  echo "== nb: new binary, TFWGPU_POOL_BLOCK_GATHER=0 (per-input gather)"; SECONDS=0
  TFWGPU_POOL_BLOCK_GATHER=0 timeout 12 $T/new ops --cases "maxpoolgrad3s2_64x112x112x64,maxpoolgrad3s2_64x112x112x64_f16" --no-same-copy --reps 5 --warm-ms 200 --json $T/nb.json; echo "rc=$? (${SECONDS}s)"
  echo "== r16: new binary, TFWGPU_NORM_ROWS=16 (float16 statistics as before)"; SECONDS=0
  TFWGPU_NORM_ROWS=16 timeout 12 $T/new ops --cases "bn_train_64x56x56x256_f16,bn_grad_64x56x56x256_f16" --no-same-copy --reps 5 --warm-ms 200 --json $T/r16.json; echo "rc=$? (${SECONDS}s)"
  echo "== compare new"; timeout 3 python3 compare.py $T/new.json $T/torch.json
  timeout 3 python3 - "$T" "$OUT/results.json" <<'PY'
import json, os, sys
t, out = sys.argv[1], sys.argv[2]
doc = {}
for k in ("new", "main", "nb", "r16", "torch"):
    p = os.path.join(t, k + ".json")
    if os.path.exists(p):
        with open(p) as f:
            doc[k] = json.load(f)
with open(out, "w") as f:
    json.dump(doc, f)
PY
  date -u
} > "$OUT/log.txt" 2>&1
kill $SMI 2>/dev/null
echo "done" >> "$OUT/log.txt"
