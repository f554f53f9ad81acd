#!/usr/bin/env bash
# bn2 request 2 (about 3 minutes): batch norm (ResNet-50 shapes at batch 64, forward and
# gradient, float32 and two float16 shapes), max pool 3x3/2 and its gradient (f32, f16),
# softmax. Binaries: new (this branch now: 16 rows per invocation in the statistics, chunks
# from the end, apply in row pairs from the start, float16 vec4 paths), old (main's kernels,
# same bench), prev (request 1's binary with TFWGPU_NORM_TARGET_GROUPS=1: 16 rows, old
# traversal order: isolates the L2-order change), PyTorch on the same cases.
# Three files under $OUT: log.txt, results.json, smi.csv.
set -u
cd "$(dirname "$0")"
T=/tmp/bn2; rm -rf $T; mkdir -p $T
for b in new old prev; do n=tfwgpu-bench; [ $b != new ] && n=tfwgpu-bench-$b; gunzip -c $n.gz > $T/$b && chmod +x $T/$b; done
BN="bn_train_32x56x56x64,bn_train_32x14x14x256,bn_train_64x112x112x64,bn_grad_64x112x112x64,bn_train_64x56x56x256,bn_grad_64x56x56x256,bn_train_64x28x28x512,bn_grad_64x28x28x512,bn_train_64x14x14x1024,bn_grad_64x14x14x1024,bn_train_64x7x7x2048,bn_grad_64x7x7x2048"
F16="bn_train_64x56x56x256_f16,bn_grad_64x56x56x256_f16,bn_train_64x14x14x1024_f16,bn_grad_64x14x14x1024_f16,maxpool3s2_64x112x112x64_f16,maxpoolgrad3s2_64x112x112x64_f16"
POOL="maxpool3s2_32x112x112x64,maxpool3s2_64x112x112x64,maxpoolgrad3s2_64x112x112x64"
ALL="softmax_65536x1000,softmax_2048x32768,$BN,$POOL,$F16"
timeout 235 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 &
SMI=$!
{
  date -u; $T/new devices 2>&1 | head -4
  echo "== new: tfwgpu-bench ops (this branch)"; SECONDS=0
  timeout 80 $T/new ops --cases "$ALL" --reps 5 --warm-ms 300 --json $T/new.json; echo "rc=$? (${SECONDS}s)"
  echo "== torch_ref.py"; SECONDS=0
  timeout 40 python3 torch_ref.py --cases "$ALL" --reps 10 --json $T/torch.json; echo "rc=$? (${SECONDS}s)"
  echo "== old: main's kernels, same bench"; SECONDS=0
  timeout 60 $T/old ops --cases "$BN,$F16" --reps 5 --warm-ms 300 --json $T/old.json; echo "rc=$? (${SECONDS}s)"
  echo "== prev: request 1's binary, TFWGPU_NORM_TARGET_GROUPS=1 (16 rows, old traversal order)"; SECONDS=0
  TFWGPU_NORM_TARGET_GROUPS=1 timeout 40 $T/prev ops --cases "$BN" --reps 5 --warm-ms 300 --json $T/prev.json; echo "rc=$? (${SECONDS}s)"
  for f in new old prev; do echo "== compare $f"; timeout 10 python3 compare.py $T/$f.json $T/torch.json; done
  python3 - "$T" "$OUT/results.json" <<'PY'
import json, os, sys
t, out = sys.argv[1], sys.argv[2]
doc = {}
for k in ("new", "old", "prev", "torch"):
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
