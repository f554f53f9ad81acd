#!/bin/bash
# mm32 request 2 (< 4 min): float32 MatMul v7, round 2 (bench/NOTES-matmul.md). Round 1 found
# 128x256x8_8x16h (two padded buffers, BK 8, next tile staged in halves, branch-free loop) at
# 43.0 TFLOP/s. Now: its variants (unpadded hp0, whole w, quarters q, plain launch order hg0,
# the 256x128 transpose), the one-buffer tiles made branch-free (s1), the new automatic choice
# (auto = tuner; TFWGPU_TUNE=0 = heuristic) on 512..8192 and transposes; PyTorch; statistics.
L=$OUT/log.txt
S=$OUT/stats.txt
export TFWGPU_TUNE_CACHE=/tmp/tune.json
{
date -u
timeout 15 ./tfwgpu-bench devices 2>&1 | head -8
nvidia-smi -i 0 --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 500 > /tmp/smi.txt 2>&1 &
SMI=$!
i=0; for t in auto 128x256x8_8x16h 128x256x8_8x16hp0 128x256x8_8x16w 128x256x8_8x16q 128x256x8_8x16hg0 256x128x8_16x8h 128x256x16_8x16qp0 128x256x16_8x16s1 128x128x8_8x16h 128x128x8_8x16w 128x128x16_8x16s1 128x256x8_8x16h; do
  i=$((i+1)); echo "== f32 4096 $t $(date -u +%T)"; timeout 15 ./tfwgpu-bench matmul --sizes 4096 --reps 7 --tiles $t --json /tmp/mm_${i}_$t.json 2>&1 | grep -v "^adapter\|^wrote\|size  *tile"
done
echo "== f32 4096 auto, tuning off"; TFWGPU_TUNE=0 timeout 15 ./tfwgpu-bench matmul --sizes 4096 --reps 7 --tiles auto --json /tmp/mm_heur.json 2>&1 | grep -v "^adapter\|^wrote\|size  *tile"
date -u +"%T sweep end"
echo "== f32 2048"; timeout 25 ./tfwgpu-bench matmul --sizes 2048 --reps 7 --tiles auto,128x256x8_8x16h,128x256x16_8x16s1,128x128x8_8x16h --json /tmp/s2048.json 2>&1 | grep -v "^adapter\|^wrote"
echo "== f32 1024"; timeout 25 ./tfwgpu-bench matmul --sizes 1024 --reps 7 --tiles auto,64x64x16_4x4w,64x64x16_4x4wp0,64x64x16_4x4h,64x64x32_4x4s1 --json /tmp/s1024.json 2>&1 | grep -v "^adapter\|^wrote"
echo "== f32 1024 tuning off"; TFWGPU_TUNE=0 timeout 15 ./tfwgpu-bench matmul --sizes 1024 --reps 7 --tiles auto --json /tmp/s1024h.json 2>&1 | grep -v "^adapter\|^wrote"
echo "== f32 512"; timeout 20 ./tfwgpu-bench matmul --sizes 512 --reps 7 --tiles auto,64x64x16_4x4w,64x64x32_4x4s1 --json /tmp/s512.json 2>&1 | grep -v "^adapter\|^wrote"
echo "== f32 8192"; timeout 25 ./tfwgpu-bench matmul --sizes 8192 --reps 5 --tiles auto --json /tmp/s8192.json 2>&1 | grep -v "^adapter\|^wrote"
for t in a b ab; do echo "== f32 transpose $t"; timeout 20 ./tfwgpu-bench matmul --sizes 1024,4096 --reps 7 --transpose $t --tiles auto --json /tmp/t$t.json 2>&1 | grep -v "^adapter\|^wrote"; done
date -u +"%T torch start"
echo "== torch"; timeout 40 python3 torch_ref.py --sizes 512,1024,2048,4096,8192 --reps 7 --json /tmp/torch.json 2>&1
date -u +"%T torch end"
kill $SMI
echo "== smi (GPU 0, 500 ms, power > 200 W)"; awk -F, '$3+0 > 200' /tmp/smi.txt
echo "== shader stats"; timeout 50 ./tfwgpu-shader-stats --filter 128x256x8_8x16h_,128x256x8_8x16hp0_ak_bn,128x256x8_8x16w_ak_bn,128x256x8_8x16q_ak_bn,256x128x8_16x8h_ak_bn,128x256x16_8x16s1_ak_bn,128x128x8_8x16w_ak_bn,128x128x16_8x16s1_ak_bn,64x64x16_4x4wp0_ak_bn,64x64x32_4x4s1_ak_bn > $S 2>&1; echo "rc $?"
date -u
} > $L 2>&1
python3 - <<'PY'
import json, os, glob
out = {}
for f in glob.glob("/tmp/*.json"):
    try: out[os.path.basename(f)[:-5]] = json.load(open(f))
    except Exception as e: out[os.path.basename(f)] = str(e)
json.dump(out, open(os.environ["OUT"] + "/results.json", "w"), indent=1)
PY
