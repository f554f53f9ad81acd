#!/bin/bash
# mm32 request 1 (< 4 min): float32 MatMul v7 sweep (bench/NOTES-matmul.md). Each tile in its
# own process. hp0/qp0 = two unpadded buffers (48 KiB), next K tile staged in halves/quarters
# around the products, one barrier per tile; p0 = two unpadded buffers, whole staging;
# wp0 = the same, whole next tile staged, not unrolled; 8x8w/4x4w likewise (17 KiB);
# 128x128x12_8x16h = 25 KiB (tests: does 32 KiB per workgroup cost the 2nd workgroup/SM?).
# Baseline: auto (= 128x256x16_8x16s1) at start and end. Then the best at 4096 on 1024/2048
# and transposed; PyTorch f32; driver statistics; SM clock/power sampled during the sweep.
L=$OUT/log.txt
S=$OUT/stats.txt
export TFWGPU_TUNE_CACHE=/tmp/tune.json
{
date -u
timeout 15 ./tfwgpu-bench devices 2>&1 | head -8
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 200 > /tmp/smi.txt 2>&1 &
SMI=$!
i=0; for t in auto 128x256x16_8x16s1 128x256x16_8x16hp0 128x256x16_8x16qp0 128x256x16_8x16wp0 128x256x16_8x16p0 256x128x16_16x8hp0 128x256x8_8x16h 128x128x12_8x16h 128x128x16_8x16h 128x128x8_8x16h 128x128x16_8x16s1 128x128x8_8x8h 128x128x8_8x8w 64x128x16_8x16hp0 auto; do
  i=$((i+1)); echo "== f32 4096 $t $(date -u +%T)"; timeout 15 ./tfwgpu-bench matmul --sizes 4096 --reps 7 --tiles $t --json /tmp/mm_${i}_$t.json 2>&1 | grep -v "^adapter\|^wrote\|size  *tile"
done
date -u +"%T.%N sweep end"
BEST=$(python3 - <<'PY'
import json, glob
best = ("auto", 0)
for f in glob.glob("/tmp/mm_*.json"):
    try:
        for r in json.load(open(f))["results"]:
            if r["m"] == 4096 and r["rel_err"] < 1e-5 and r["gflops"] > best[1]:
                best = (r["tile"], r["gflops"])
    except Exception:
        pass
print(best[0])
PY
)
echo "== best at 4096: $BEST"
echo "== f32 2048 auto,$BEST"; timeout 25 ./tfwgpu-bench matmul --sizes 2048 --reps 7 --tiles auto,$BEST --json /tmp/s2048.json 2>&1 | grep -v "^adapter\|^wrote"
echo "== f32 1024 auto,64x64x16_4x4h,64x64x16_4x4w"; timeout 25 ./tfwgpu-bench matmul --sizes 1024 --reps 7 --tiles auto,64x64x16_4x4h,64x64x16_4x4w --json /tmp/s1024.json 2>&1 | grep -v "^adapter\|^wrote"
echo "== f32 4096 transpose ab auto,$BEST"; timeout 25 ./tfwgpu-bench matmul --sizes 4096 --reps 7 --transpose ab --tiles auto,$BEST --json /tmp/tab.json 2>&1 | grep -v "^adapter\|^wrote"
echo "== f32 4096 again $BEST"; timeout 25 ./tfwgpu-bench matmul --sizes 4096 --reps 7 --tiles $BEST --json /tmp/again.json 2>&1 | grep -v "^adapter\|^wrote"
date -u
date -u +"%T.%N torch start"
echo "== torch"; timeout 40 python3 torch_ref.py --sizes 1024,2048,4096 --reps 7 --json /tmp/torch.json 2>&1
date -u
date -u +"%T.%N torch end"
kill $SMI
echo "== smi (200 ms samples) during the runs"; cat /tmp/smi.txt
echo "== shader stats"; timeout 50 ./tfwgpu-shader-stats --filter 128x256x16_8x16s1_ak_bn,128x256x16_8x16hp0_ak_bn,128x256x16_8x16qp0_ak_bn,128x256x16_8x16wp0_ak_bn,128x256x16_8x16p0_ak_bn,256x128x16_16x8hp0_ak_bn,128x256x8_8x16h_ak_bn,128x128x12_8x16h_ak_bn,128x128x16_8x16h_ak_bn,128x128x8_8x16h_ak_bn,128x128x8_8x8h_ak_bn,128x128x8_8x8w_ak_bn,64x128x16_8x16hp0_ak_bn,64x64x16_4x4h_ak_bn,64x64x16_4x4w_ak_bn > $S 2>&1; echo "rc $?"
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
