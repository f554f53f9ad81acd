#!/usr/bin/env bash
# Lead, session 5, batch 1 (runs from .h200req/lead5 inside the repo root's copy; TF installed
# and the plugin set up by bench/gpu_host.sh run). Results under $OUT.
set -u
R=../..   # repo root
cd $R
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
echo "== x2 scaling, steady state"
bash bench/gpu_host.sh run 'bash bench/h200x2_mirrored.sh default'
echo "== traced 2-GPU run"
bash bench/gpu_host.sh run 'TFWGPU_TRACE=/tmp/mirrored.trace timeout 150 python3 bench/mirrored.py --per-gpu-batch 256 --steps 30 --skip 3 2>&1 | grep -E "images_per_s|speedup"; python3 bench/trace_threads.py /tmp/mirrored.trace --json $OUT/trace-threads.json | tail -8; gzip -c /tmp/mirrored.trace > $OUT/mirrored.trace.gz'
echo "== CNN b256 replay (1 GPU part of the last session-5 trace)"
zcat .h200req/lead5/cnn-b256-1gpu.trace.gz > /tmp/cnn256.trace
timeout 120 $B replay /tmp/cnn256.trace --repeat 3 --top 25 --json $OUT/replay-cnn256.json 2>&1 | tail -45
echo "== ResNet-50 capture (fusion on) + replay"
bash bench/gpu_host.sh run 'timeout 200 python3 bench/keras_models.py --models resnet50 --trace /tmp/tr --trace-steps 3 2>&1 | tail -2'
gzip -c /tmp/tr/resnet50.trace > $OUT/resnet50-fused.trace.gz
timeout 150 $B replay /tmp/tr/resnet50.trace --repeat 3 --top 40 --json $OUT/replay-r50.json 2>&1 | tail -70

echo "== transfers: ours, then torch"
timeout 60 $B transfer --mb 0.8,38.5,154 --reps 10 --json $OUT/transfer.json 2>&1 | tail -3
python3 - <<'PY' 2>&1 | tee $OUT/torch-transfer.txt
import time, torch
for mb in (0.8, 38.5, 154):
    n = int(mb * 1e6 / 4)
    for kind in ("pageable", "pinned"):
        h = torch.randn(n)
        if kind == "pinned":
            h = h.pin_memory()
        d = h.cuda(); torch.cuda.synchronize()
        ts = []
        for _ in range(10):
            t = time.perf_counter(); d.copy_(h, non_blocking=True); torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
        ts.sort(); u = ts[5]
        ts = []
        for _ in range(10):
            t = time.perf_counter(); b = d.cpu(); ts.append(time.perf_counter() - t)
        ts.sort(); dn = ts[5]
        print(f"torch {mb:7.2f} MB {kind:8s} h2d {u*1e3:8.3f} ms {mb/1e3/u:6.2f} GB/s  d2h {dn*1e3:8.3f} ms {mb/1e3/dn:6.2f} GB/s")
PY
echo "== torch resnet50/cnn, input fed from host each step vs kept on the GPU"
for f in device pinned pageable; do
  timeout 100 python3 bench/torch_models.py --models resnet50,cnn --modes f32 --layouts channels_last --steps 20 --warmup 5 --feed $f --json $OUT/torch-models-$f.json 2>&1 | grep -E "train"
done
ls -la $OUT
