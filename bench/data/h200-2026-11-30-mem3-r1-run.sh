#!/usr/bin/env bash
# mem3 request 1 (about 3.5 minutes): float16 batch norm / max pool with the hardware half
# conversions (self-test on the adapter), max pool 3-D grid + built-in max, softmax with a
# branch-free exp and 32768-column rows in registers (1024-invocation workgroups), small tensors with
# a copy of their own bytes. Binaries: new (branch mem3), main (main's binary, same cases where
# it has them), new with TFWGPU_F16_CONVERSIONS=software (isolates the conversions); PyTorch on
# the same cases. Three files under $OUT: log.txt, results.json, smi.csv.
set -u
cd "$(dirname "$0")"
T=/tmp/mem3; rm -rf $T; mkdir -p $T
for b in new main; do gunzip -c tfwgpu-bench-$b.gz > $T/$b && chmod +x $T/$b; done
SM="softmax_65536x1000,softmax_2048x32768"
F16="bn_train_64x56x56x256_f16,bn_grad_64x56x56x256_f16,bn_train_64x14x14x1024_f16,bn_grad_64x14x14x1024_f16,maxpool3s2_64x112x112x64_f16,maxpoolgrad3s2_64x112x112x64_f16"
F16NEW="bn_train_64x7x7x2048_f16,bn_grad_64x7x7x2048_f16"
F32="bn_train_64x56x56x256,bn_grad_64x56x56x256,bn_train_64x14x14x1024,bn_grad_64x14x14x1024,bn_train_64x7x7x2048,bn_grad_64x7x7x2048,maxpool3s2_64x112x112x64,maxpoolgrad3s2_64x112x112x64,bn_train_64x112x112x64,bn_grad_64x112x112x64"
SMALL="add_bcast_1024x1024,mul_1024x1024,bn_train_32x14x14x256,bn_train_32x56x56x64"
ALL="$SM,$F16,$F16NEW,$F32,$SMALL"
export TFWGPU_LOG=warn,tfwgpu_runtime::kernels::f16conv=info
timeout 232 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 &
SMI=$!
{
  date -u; $T/new devices 2>&1 | head -4
  echo "== new: tfwgpu-bench ops (branch mem3)"; SECONDS=0
  timeout 110 $T/new ops --cases "$ALL" --reps 5 --warm-ms 300 --json $T/new.json; echo "rc=$? (${SECONDS}s)"
  echo "== torch_ref.py"; SECONDS=0
  timeout 35 python3 torch_ref.py --cases "$ALL" --reps 10 --json $T/torch.json; echo "rc=$? (${SECONDS}s)"
  echo "== main: main's binary, same bench cases"; SECONDS=0
  timeout 40 $T/main ops --cases "$SM,$F16,bn_train_64x7x7x2048,bn_train_32x14x14x256" --reps 5 --warm-ms 300 --json $T/main.json; echo "rc=$? (${SECONDS}s)"
  echo "== sw: new binary, TFWGPU_F16_CONVERSIONS=software"; SECONDS=0
  TFWGPU_F16_CONVERSIONS=software timeout 30 $T/new ops --cases "$F16" --no-same-copy --reps 5 --warm-ms 300 --json $T/sw.json; echo "rc=$? (${SECONDS}s)"
  for f in new main sw; do echo "== compare $f"; timeout 5 python3 compare.py $T/$f.json $T/torch.json; done
  python3 - "$T" "$OUT/results.json" <<'PY'
import json, os, sys
t, out = sys.argv[1], sys.argv[2]
doc = {}
for k in ("new", "main", "sw", "torch"):
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
