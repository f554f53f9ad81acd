#!/bin/bash
# coop3 request 1 (< 4 min): f16 cooperative-matrix MatMul variants on the H200.
# New tiles: u = vec4<u32> workgroup arrays with 16-byte global loads and shared stores
# (fragments loaded as f16 through u32-vector pointers); ug1 = one buffer, K tiles of 64;
# ug2/vg2 = loads two K tiles ahead (two register sets); 4x4 = 16 subgroups of 32x32.
# Driver register counts of every coop variant (tfwgpu-shader-stats), torch in the same run.
L=$OUT/log.txt
S=$OUT/stats.txt
{
date -u
timeout 15 ./tfwgpu-bench devices 2>&1 | head -8
echo "== shader stats"; timeout 60 ./tfwgpu-shader-stats --filter coop_ > $S 2>&1; echo "rc $?"; tail -3 $S
date -u
NEW=c128x128x32_2x4ug,c128x128x32_4x2ug,c128x128x32_4x4ug,c128x128x64_2x4ug1,c128x128x64_2x4vg1,c128x128x32_2x4ug2,c128x128x32_2x4vg2,c128x128x32_4x2ug2,c128x128x64_4x4ug1,c128x128x32_4x4ug2
echo "== f16 sweep 4096"; timeout 40 ./tfwgpu-bench matmul --dtype f16 --sizes 4096 --reps 5 --tiles auto,c128x128x32_2x4v,$NEW --json /tmp/s4096.json 2>&1
date -u
echo "== f16 sweep 2048,8192"; timeout 40 ./tfwgpu-bench matmul --dtype f16 --sizes 2048,8192 --reps 5 --tiles auto,c128x128x32_2x4ug,c128x128x64_2x4ug1,c128x128x32_2x4ug2,c128x128x32_4x4ug,c128x128x32_4x4ug2 --json /tmp/s2k8k.json 2>&1
echo "== f16 sweep 1024"; timeout 20 ./tfwgpu-bench matmul --dtype f16 --sizes 1024 --reps 5 --tiles auto,c128x128x32_2x4ug,c128x128x32_2x4ug2,c64x64x32_2x2u,c64x64x32_2x2v --json /tmp/s1024.json 2>&1
date -u
echo "== f16 odd sizes (partial tiles, odd K tile counts)"; timeout 25 ./tfwgpu-bench matmul --dtype f16 --sizes 1000,4104 --reps 3 --tiles auto,c128x128x32_2x4ug,c128x128x64_2x4ug1,c128x128x32_2x4ug2,c128x128x32_4x4ug2,c128x128x64_4x4ug1 --json /tmp/odd.json 2>&1
for t in a b ab; do echo "== f16 transpose $t 4096"; timeout 15 ./tfwgpu-bench matmul --dtype f16 --sizes 4096 --reps 3 --transpose $t --tiles auto,c128x128x32_2x4ug,c128x128x32_2x4ug2,c128x128x64_2x4ug1 --json /tmp/t$t.json 2>&1; done
date -u
echo "== f32 (ours)"; timeout 20 ./tfwgpu-bench matmul --sizes 2048,4096 --reps 3 --json /tmp/f32.json 2>&1
echo "== f32 reduced"; timeout 15 ./tfwgpu-bench matmul --reduced --sizes 4096 --reps 3 --json /tmp/red.json 2>&1
echo "== conv f16"; timeout 25 ./tfwgpu-bench conv --dtype f16 --cases resnet,wide --ops fwd --tiles auto,c128x128x32_2x4ug,c128x128x32_2x4ug2,c64x64x32_2x2u,c128x128x64_2x4ug1 --json /tmp/conv16.json 2>&1
date -u
echo "== torch"; timeout 25 python3 torch_ref.py --sizes 1024,2048,4096,8192 --reps 5 --json /tmp/torch.json 2>&1
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
