#!/usr/bin/env bash
# mem5 request 1 (about 130 s, every step under `timeout`). Binaries: new (branch mem5: float16
# MaxPool / MaxPoolGrad and float16 batch-norm statistics / apply eight channels per invocation
# (16-byte loads); softmax row reductions through subgroups where a workgroup holds one row),
# main (main's binary, same cases), A/B runs of the new binary (TFWGPU_POOL_F16X8=0 and
# TFWGPU_NORM_F16X8=0: four channels as main; TFWGPU_SOFTMAX_SUBGROUP=0: the shared-memory
# trees as main; TFWGPU_CAST_F16_F32=x4: Cast f16 -> f32 four elements per invocation with
# contiguous 16-byte stores instead of eight; TFWGPU_NORM_ONEPASS=1 with _TC=2 / 4: the one-dispatch
# batch norm with 32-byte runs on 64x14x14x1024 and 64x7x7x2048 gradients); PyTorch on the same cases.
# Three files under $OUT: log.txt, results.json, smi.csv.
set -u
cd "$(dirname "$0")"
T=/tmp/mem5; rm -rf $T; mkdir -p $T
for b in new main; do gunzip -c tfwgpu-bench-$b.gz > $T/$b && chmod +x $T/$b; done
POOL="maxpool3s2_64x112x112x64_f16,maxpoolgrad3s2_64x112x112x64_f16"
SM="softmax_2048x32768"
CAST="cast_f16_f32_64x56x56x256,cast_f16_f32_64x14x14x1024"
BN="bn_train_64x56x56x256_f16,bn_grad_64x56x56x256_f16,bn_train_64x14x14x1024_f16,bn_grad_64x14x14x1024_f16,bn_grad_64x7x7x2048_f16"
ALL="$POOL,$SM,$CAST,$BN"
export TFWGPU_LOG=warn,tfwgpu_runtime::kernels::f16conv=info
timeout 148 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 &
SMI=$!
{
  date -u; timeout 4 $T/new devices 2>&1 | head -4
  echo "== new: tfwgpu-bench ops (branch mem5), pool, softmax, cast"; SECONDS=0
  timeout 24 $T/new ops --cases "$POOL,$SM,$CAST" --reps 5 --warm-ms 300 --json $T/new.json; echo "rc=$? (${SECONDS}s)"
  echo "== new: tfwgpu-bench ops (branch mem5), batch norm"; SECONDS=0
  timeout 24 $T/new ops --cases "$BN" --reps 5 --warm-ms 300 --json $T/newbn.json; echo "rc=$? (${SECONDS}s)"
  echo "== main: main's binary, same bench cases"; SECONDS=0
  timeout 27 $T/main ops --cases "$ALL" --reps 5 --warm-ms 300 --no-same-copy --json $T/main.json; echo "rc=$? (${SECONDS}s)"
  echo "== torch_ref.py"; SECONDS=0
  timeout 13 python3 torch_ref.py --cases "$ALL" --reps 10 --json $T/torch.json; echo "rc=$? (${SECONDS}s)"
  echo "== x4: new binary, TFWGPU_POOL_F16X8=0 (four channels per invocation, as main)"; SECONDS=0
  TFWGPU_POOL_F16X8=0 timeout 7 $T/new ops --cases "$POOL" --no-same-copy --reps 5 --warm-ms 200 --json $T/x4.json; echo "rc=$? (${SECONDS}s)"
  echo "== n4: new binary, TFWGPU_NORM_F16X8=0 (batch norm four channels per invocation, as main)"; SECONDS=0
  TFWGPU_NORM_F16X8=0 timeout 12 $T/new ops --cases "$BN" --no-same-copy --reps 5 --warm-ms 200 --json $T/n4.json; echo "rc=$? (${SECONDS}s)"
  echo "== tree: new binary, TFWGPU_SOFTMAX_SUBGROUP=0 (shared-memory trees, as main)"; SECONDS=0
  TFWGPU_SOFTMAX_SUBGROUP=0 timeout 5 $T/new ops --cases "$SM" --no-same-copy --reps 5 --warm-ms 200 --json $T/tree.json; echo "rc=$? (${SECONDS}s)"
  echo "== c4: new binary, TFWGPU_CAST_F16_F32=x4 (four elements per invocation)"; SECONDS=0
  TFWGPU_CAST_F16_F32=x4 timeout 6 $T/new ops --cases "$CAST" --no-same-copy --reps 5 --warm-ms 200 --json $T/c4.json; echo "rc=$? (${SECONDS}s)"
  echo "== op2 / op4: new binary, one-dispatch batch norm forced (TFWGPU_NORM_ONEPASS=1) with 2 / 4 channel quads per workgroup (32-byte runs)"; SECONDS=0
  TFWGPU_NORM_ONEPASS=1 TFWGPU_NORM_ONEPASS_TC=2 timeout 8 $T/new ops --cases "bn_train_64x14x14x1024,bn_grad_64x14x14x1024,bn_grad_64x7x7x2048" --no-same-copy --reps 5 --warm-ms 200 --json $T/op2.json; echo "rc=$? (${SECONDS}s)"
  TFWGPU_NORM_ONEPASS=1 TFWGPU_NORM_ONEPASS_TC=4 timeout 8 $T/new ops --cases "bn_train_64x14x14x1024_f16,bn_grad_64x14x14x1024_f16,bn_grad_64x7x7x2048_f16" --no-same-copy --reps 5 --warm-ms 200 --json $T/op4.json; echo "rc=$? (${SECONDS}s)"
  for f in new newbn main; do echo "== compare $f"; timeout 3 python3 compare.py $T/$f.json $T/torch.json; done
  timeout 3 python3 - "$T" "$OUT/results.json" <<'PY'
import json, os, sys
t, out = sys.argv[1], sys.argv[2]
doc = {}
for k in ("new", "newbn", "main", "x4", "n4", "tree", "c4", "op2", "op4", "torch"):
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
