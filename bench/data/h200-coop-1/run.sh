#!/bin/bash
# coop request 1: first run of the cooperative-matrix (tensor core) MatMul/Conv2D.
# (1) correctness: the coop test binary (f16 MatMul/Conv2D vs f64 reference, every tile/layout);
# (2) f16 speed per tile 1024..4096 (+8192 auto), transposes at 4096; f32 and f32 opt-in;
# (3) Conv2D f16 vs our f32 GEMM; (4) torch f32/tf32/f16 matmul and conv references.
L=$OUT/log.txt
{
echo "== devices"; timeout 20 ./tfwgpu-bench devices 2>&1 | head -60
echo "== tests"; [ -x ./matmul_coop ] && timeout 70 ./matmul_coop --test-threads 1 2>&1 | tail -60
echo "== f16 tiles"
timeout 90 ./tfwgpu-bench matmul --dtype f16 --sizes 1024,2048,4096 --reps 5 --tiles auto,c128x128x32_2x4,c128x128x32_2x4v,c128x128x32_2x2,c128x128x32_2x2v,c64x64x32_2x2v,nocoop --json /tmp/f16.json 2>&1
echo "== f16 8192"
timeout 30 ./tfwgpu-bench matmul --dtype f16 --sizes 8192 --reps 3 --tiles auto,c128x128x32_2x4v --json /tmp/f16-8k.json 2>&1
for t in a b ab; do echo "== f16 transpose $t"; timeout 15 ./tfwgpu-bench matmul --dtype f16 --sizes 4096 --reps 3 --transpose $t --json /tmp/f16-t$t.json 2>&1; done
echo "== f32"; timeout 20 ./tfwgpu-bench matmul --sizes 4096 --reps 3 --json /tmp/f32.json 2>&1
echo "== f32 reduced"; timeout 20 ./tfwgpu-bench matmul --reduced --sizes 1024,4096 --reps 3 --json /tmp/red.json 2>&1
echo "== conv f16"; timeout 40 ./tfwgpu-bench conv --dtype f16 --cases resnet,wide --ops fwd --tiles auto,c128x128x32_2x4v,c64x64x32_2x2v,gemm --json /tmp/conv16.json 2>&1
echo "== conv f32"; timeout 20 ./tfwgpu-bench conv --cases resnet,wide --ops fwd --json /tmp/conv32.json 2>&1
echo "== torch"; timeout 40 python3 torch_ref.py --sizes 1024,2048,4096,8192 --reps 10 --json /tmp/torch.json 2>&1
echo "== torch conv"; timeout 30 python3 torch_conv_f16.py --json /tmp/torchconv.json 2>&1
} > $L 2>&1
python3 - <<'PY'
import json, os, glob
out = {}
for f in glob.glob("/tmp/*.json"):
    try: out[os.path.basename(f)[:-5]] = json.load(open(f))
    except Exception as e: out[os.path.basename(f)] = str(e)
json.dump(out, open(os.environ["OUT"] + "/results.json", "w"), indent=1)
PY
