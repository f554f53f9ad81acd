#!/bin/bash
# coop final request (<= 2 min): the coop test binary on the H200 (every tile, awkward shapes,
# batches, Conv2D), f16 MatMul auto at 1024..8192, a tile sweep at 4096, our f32 path and the
# f32 opt-in at 1024..8192, Conv2D f16 / opt-in, torch f32/tf32/f16 in the same run.
L=$OUT/log.txt
{
date -u
timeout 15 ./tfwgpu-bench devices 2>&1 | head -7
echo "== tests"; timeout 35 ./matmul_coop --test-threads 16 2>&1 | tail -22
date -u
echo "== f16 auto"; timeout 20 ./tfwgpu-bench matmul --dtype f16 --sizes 1024,2048,4096,8192 --reps 5 --json /tmp/f16.json 2>&1
echo "== f16 sweep 4096"; timeout 15 ./tfwgpu-bench matmul --dtype f16 --sizes 4096 --reps 5 --tiles c128x128x32_2x4v,c128x128x32_4x2vg,c128x64x32_2x2vg,c128x128x16_2x4vg,c256x128x16_4x2vg,c128x128x32_2x4mg,c128x128x16_2x4mg --json /tmp/f16sweep.json 2>&1
echo "== f16 ab 4096"; timeout 8 ./tfwgpu-bench matmul --dtype f16 --sizes 4096 --reps 3 --transpose ab --json /tmp/f16ab.json 2>&1
echo "== f32"; timeout 15 ./tfwgpu-bench matmul --sizes 1024,2048,4096,8192 --reps 3 --json /tmp/f32.json 2>&1
echo "== f32 reduced"; timeout 15 ./tfwgpu-bench matmul --reduced --sizes 1024,2048,4096,8192 --reps 3 --json /tmp/red.json 2>&1
date -u
echo "== conv f16"; timeout 10 ./tfwgpu-bench conv --dtype f16 --cases resnet,wide --ops fwd --json /tmp/conv16.json 2>&1
echo "== conv f16 wide tile"; timeout 8 ./tfwgpu-bench conv --dtype f16 --cases wide,resnet --ops fwd --tiles c128x128x32_2x4mg --json /tmp/conv16m.json 2>&1
echo "== conv f32 reduced"; timeout 10 ./tfwgpu-bench conv --reduced --cases resnet,wide --ops fwd --json /tmp/convred.json 2>&1
echo "== torch"; timeout 15 python3 torch_ref.py --sizes 1024,2048,4096,8192 --reps 5 --json /tmp/torch.json 2>&1
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
