#!/usr/bin/env bash
# mem5 request 2 (at most 120 s; every step under `timeout`). Binaries: new (branch mem5 after
# request 1 (softmax, measured there, not repeated): float16 MaxPoolGrad gathers skip the
# half round trip where the sum is exact (a lane's first gradient); the eight-channel float16
# pool / batch-norm paths of request 1 now opt-in only), main (main's binary, same cases), A/B
# runs of the new binary (TFWGPU_POOL_RT_SKIP=0: round trip after every addition as main;
# TFWGPU_CAST_F16_F32=x4: Cast f16 -> f32 four elements per invocation (request 1 lost it to a
# time limit); TFWGPU_NORM_ONEPASS=1 with _TC=2: the one-dispatch batch norm with 32-byte runs,
# against the three dispatches of the same binary; TFWGPU_POOL_F16_FAST=0: float16 MaxPool and
# argmax codes on the halves' integer keys without widening); PyTorch on the same cases.
# `--one-copy`: the new binary runs only the four-vec4 large copy (the other four cost ~5 s per
# invocation). Three files under $OUT: log.txt, results.json, smi.csv.
set -u
cd "$(dirname "$0")"
T=/tmp/mem5; rm -rf $T; mkdir -p $T
for b in new main; do gunzip -c tfwgpu-bench-$b.gz > $T/$b && chmod +x $T/$b; done
MAIN="maxpoolgrad3s2_64x112x112x64_f16,maxpool3s2_64x112x112x64_f16,cast_f16_f32_64x56x56x256,cast_f16_f32_64x14x14x1024"
BN32="bn_train_64x14x14x1024,bn_grad_64x14x14x1024,bn_grad_64x7x7x2048"
export TFWGPU_LOG=warn,tfwgpu_runtime::kernels::f16conv=info
timeout 118 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 &
SMI=$!
{
  date -u; timeout 3 $T/new devices 2>&1 | head -2
  echo "== new: tfwgpu-bench ops (branch mem5)"; SECONDS=0
  timeout 24 $T/new ops --one-copy --cases "$MAIN" --reps 5 --warm-ms 300 --json $T/new.json; echo "rc=$? (${SECONDS}s)"
  echo "== main: main's binary, same bench cases"; SECONDS=0
  timeout 20 $T/main ops --cases "$MAIN" --reps 5 --warm-ms 300 --no-same-copy --json $T/main.json; echo "rc=$? (${SECONDS}s)"
  echo "== torch_ref.py"; SECONDS=0
  timeout 8 python3 torch_ref.py --cases "$MAIN" --reps 10 --json $T/torch.json; echo "rc=$? (${SECONDS}s)"
  echo "== rt0: new binary, TFWGPU_POOL_RT_SKIP=0"; SECONDS=0
  TFWGPU_POOL_RT_SKIP=0 timeout 6 $T/new ops --one-copy --cases "maxpoolgrad3s2_64x112x112x64_f16" --no-same-copy --reps 5 --warm-ms 200 --json $T/rt0.json; echo "rc=$? (${SECONDS}s)"
  echo "== c4: new binary, TFWGPU_CAST_F16_F32=x4"; SECONDS=0
  TFWGPU_CAST_F16_F32=x4 timeout 7 $T/new ops --one-copy --cases "cast_f16_f32_64x56x56x256,cast_f16_f32_64x14x14x1024" --no-same-copy --reps 5 --warm-ms 200 --json $T/c4.json; echo "rc=$? (${SECONDS}s)"
  echo "== bn3: new binary, batch norm as chosen (three dispatches on these shapes)"; SECONDS=0
  timeout 10 $T/new ops --one-copy --cases "$BN32" --no-same-copy --reps 5 --warm-ms 200 --json $T/bn3.json; echo "rc=$? (${SECONDS}s)"
  echo "== op2: new binary, TFWGPU_NORM_ONEPASS=1 with _TC=2 (float32)"; SECONDS=0
  TFWGPU_NORM_ONEPASS=1 TFWGPU_NORM_ONEPASS_TC=2 timeout 10 $T/new ops --one-copy --cases "$BN32" --no-same-copy --reps 5 --warm-ms 200 --json $T/op2.json; echo "rc=$? (${SECONDS}s)"
  echo "== keys: new binary, TFWGPU_POOL_F16_FAST=0 (float16 windows on integer keys, no widening)"; SECONDS=0
  TFWGPU_POOL_F16_FAST=0 timeout 11 $T/new ops --one-copy --cases "maxpool3s2_64x112x112x64_f16,maxpoolgrad3s2_64x112x112x64_f16" --no-same-copy --reps 5 --warm-ms 200 --json $T/keys.json; echo "rc=$? (${SECONDS}s)"
  echo "== compare new"; timeout 3 python3 compare.py $T/new.json $T/torch.json
  timeout 3 python3 - "$T" "$OUT/results.json" <<'PY'
import json, os, sys
t, out = sys.argv[1], sys.argv[2]
doc = {}
for k in ("new", "main", "rt0", "c4", "bn3", "op2", "keys", "torch"):
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
