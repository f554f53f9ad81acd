#!/usr/bin/env bash
# bn2 request 1 (about 3.5 minutes): batch norm (ResNet-50 shapes, forward and gradient), max
# pool 3x3/2 and its gradient, softmax: this branch's kernels (new), main's kernels (old: the
# same bench cases on the tree before this branch's kernel changes), the batch-norm statistics
# with 16 rows per invocation (TFWGPU_NORM_TARGET_GROUPS=1, the old row count on the new
# shader), PyTorch on the same cases. Three files under $OUT: log.txt, results.json, smi.csv.
set -u
cd "$(dirname "$0")"
T=/tmp/bn2; rm -rf $T; mkdir -p $T
gunzip -c tfwgpu-bench.gz > $T/new && gunzip -c tfwgpu-bench-old.gz > $T/old && chmod +x $T/new $T/old
BN="bn_train_64x112x112x64,bn_grad_64x112x112x64,bn_train_64x56x56x256,bn_grad_64x56x56x256,bn_train_64x28x28x512,bn_grad_64x28x28x512,bn_train_64x14x14x1024,bn_grad_64x14x14x1024,bn_train_64x7x7x2048,bn_grad_64x7x7x2048"
ALL="softmax_65536x1000,softmax_2048x32768,bn_train_32x56x56x64,bn_train_32x14x14x256,$BN,maxpool3s2_32x112x112x64,maxpool3s2_64x112x112x64,maxpoolgrad3s2_64x112x112x64"
OLD="softmax_65536x1000,softmax_2048x32768,bn_train_32x56x56x64,bn_train_64x112x112x64,bn_grad_64x112x112x64,bn_train_64x14x14x1024,bn_grad_64x14x14x1024,bn_train_64x7x7x2048,bn_grad_64x7x7x2048,maxpool3s2_64x112x112x64,maxpoolgrad3s2_64x112x112x64"
AB="bn_train_32x56x56x64,bn_train_64x7x7x2048,bn_grad_64x7x7x2048,bn_train_64x112x112x64"
timeout 235 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 &
SMI=$!
{
  date -u; $T/new devices 2>&1 | head -4
  echo "== new: tfwgpu-bench ops (this branch)"; SECONDS=0
  timeout 85 $T/new ops --cases "$ALL" --reps 5 --warm-ms 300 --json $T/new.json; echo "rc=$? (${SECONDS}s)"
  echo "== torch_ref.py"; SECONDS=0
  timeout 45 python3 torch_ref.py --cases "$ALL" --reps 10 --json $T/torch.json; echo "rc=$? (${SECONDS}s)"
  echo "== old: main's kernels, same bench"; SECONDS=0
  timeout 60 $T/old ops --cases "$OLD" --reps 5 --warm-ms 300 --json $T/old.json; echo "rc=$? (${SECONDS}s)"
  echo "== ab: new kernels, TFWGPU_NORM_TARGET_GROUPS=1 (16 rows per invocation)"; SECONDS=0
  TFWGPU_NORM_TARGET_GROUPS=1 timeout 30 $T/new ops --cases "$AB" --reps 5 --warm-ms 300 --json $T/ab.json; echo "rc=$? (${SECONDS}s)"
  for f in new old ab; do echo "== compare $f"; timeout 10 python3 compare.py $T/$f.json $T/torch.json; done
  python3 - "$T" "$OUT/results.json" <<'PY'
import json, os, sys
t, out = sys.argv[1], sys.argv[2]
doc = {}
for k in ("new", "old", "ab", "torch"):
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
