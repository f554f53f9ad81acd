#!/usr/bin/env bash
# mem4 request 1 (about 3.5 minutes). Binaries: new (branch mem4: training batch norm in one
# dispatch where a workgroup owns whole channels; float16 Cast / elementwise through f16conv's
# hardware conversions, Cast 8 elements per invocation, float16 binary ops on vec4 words),
# main (main's binary, the cases it has), new with TFWGPU_NORM_ONEPASS=0 / _TC=1|4 (A/B of the
# one-dispatch batch norm), new with TFWGPU_F16_CONVERSIONS=software (isolates the
# conversions); PyTorch on the same cases. Three files under $OUT: log.txt, results.json, smi.csv.
set -u
cd "$(dirname "$0")"
T=/tmp/mem4; rm -rf $T; mkdir -p $T
for b in new main; do gunzip -c tfwgpu-bench-$b.gz > $T/$b && chmod +x $T/$b; done
BNS="bn_train_32x14x14x256,bn_train_64x14x14x1024,bn_grad_64x14x14x1024,bn_train_64x7x7x2048,bn_grad_64x7x7x2048"
BNS16="bn_train_64x14x14x1024_f16,bn_grad_64x14x14x1024_f16,bn_train_64x7x7x2048_f16,bn_grad_64x7x7x2048_f16"
BNL16="bn_train_64x56x56x256_f16,bn_grad_64x56x56x256_f16"
POOL="maxpool3s2_64x112x112x64,maxpoolgrad3s2_64x112x112x64,maxpool3s2_64x112x112x64_f16,maxpoolgrad3s2_64x112x112x64_f16"
SM="softmax_2048x32768"
CAST="cast_f32_f16_64x56x56x256,cast_f16_f32_64x56x56x256,add_64x56x56x256_f16,add_64x56x56x256,cast_f32_f16_64x14x14x1024,cast_f16_f32_64x14x14x1024,add_64x14x14x1024_f16,add_64x14x14x1024"
ALL="$BNS,$BNS16,$BNL16,$POOL,$SM,$CAST"
export TFWGPU_LOG=warn,tfwgpu_runtime::kernels::f16conv=info
timeout 235 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 &
SMI=$!
{
  date -u; $T/new devices 2>&1 | head -4
  echo "== new: tfwgpu-bench ops (branch mem4)"; SECONDS=0
  timeout 95 $T/new ops --cases "$ALL" --reps 5 --warm-ms 300 --json $T/new.json; echo "rc=$? (${SECONDS}s)"
  echo "== torch_ref.py"; SECONDS=0
  timeout 25 python3 torch_ref.py --cases "$ALL" --reps 10 --json $T/torch.json; echo "rc=$? (${SECONDS}s)"
  echo "== main: main's binary, same bench cases"; SECONDS=0
  timeout 40 $T/main ops --cases "$BNS,$BNS16,$BNL16,maxpool3s2_64x112x112x64_f16,maxpoolgrad3s2_64x112x112x64_f16" --reps 5 --warm-ms 300 --no-same-copy --json $T/main.json; echo "rc=$? (${SECONDS}s)"
  echo "== ab0: new binary, TFWGPU_NORM_ONEPASS=0 (three dispatches)"; SECONDS=0
  TFWGPU_NORM_ONEPASS=0 timeout 20 $T/new ops --cases "$BNS,$BNS16" --no-same-copy --reps 5 --warm-ms 200 --json $T/ab0.json; echo "rc=$? (${SECONDS}s)"
  echo "== tc1 / tc4: new binary, TFWGPU_NORM_ONEPASS_TC=1 and 4"; SECONDS=0
  TFWGPU_NORM_ONEPASS_TC=1 timeout 8 $T/new ops --cases "bn_train_64x7x7x2048,bn_grad_64x7x7x2048" --no-same-copy --reps 5 --warm-ms 200 --json $T/tc1.json; echo "rc=$? (${SECONDS}s)"
  TFWGPU_NORM_ONEPASS_TC=4 timeout 8 $T/new ops --cases "bn_train_64x7x7x2048,bn_grad_64x7x7x2048,bn_train_64x14x14x1024" --no-same-copy --reps 5 --warm-ms 200 --json $T/tc4.json; echo "rc=$? (${SECONDS}s)"
  echo "== sw: new binary, TFWGPU_F16_CONVERSIONS=software"; SECONDS=0
  TFWGPU_F16_CONVERSIONS=software timeout 15 $T/new ops --cases "cast_f32_f16_64x56x56x256,cast_f16_f32_64x56x56x256,add_64x56x56x256_f16,bn_train_64x7x7x2048_f16" --no-same-copy --reps 5 --warm-ms 200 --json $T/sw.json; echo "rc=$? (${SECONDS}s)"
  for f in new main ab0; do echo "== compare $f"; timeout 3 python3 compare.py $T/$f.json $T/torch.json; done
  python3 - "$T" "$OUT/results.json" <<'PY'
import json, os, sys
t, out = sys.argv[1], sys.argv[2]
doc = {}
for k in ("new", "main", "ab0", "tc1", "tc4", "sw", "torch"):
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
