#!/usr/bin/env bash
# Lead, session 7, final call (x2 host, TF staged): the merged tree (mem3, convh, redfuse,
# hostcnn, the lead's runtime changes). MatMul f16/f32; Conv2D f16/f32 (convh); float16
# memory-bound (mem3); ResNet-50 replay with the fused-reduction trace (GPU busy); Keras end to
# end with PyTorch (and the CNN with main's old event/bind-group behaviour); two H200s with
# MirroredStrategy.
set -u
cd ../..
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-l20.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
echo "== matmul 4096 f32 / f16 $(date +%T)"
timeout 30 $B matmul --sizes 4096 --reps 5 --json $OUT/mm-f32.json 2>&1 | grep -E "^ *matmul|4096" | tail -1
timeout 30 $B matmul --dtype f16 --sizes 4096 --reps 5 --json $OUT/mm-f16.json 2>&1 | grep -E "^ *matmul|4096" | tail -1
echo "== CONV $(date +%T)"
C=wide,r50_56_1x1_64_64,r50_56_1x1_64_256,r50_56_1x1_256_64,r50_56_1x1_256_128_s2,r50_56_3x3_128_128_s2,r50_28_3x3_128_128,r50_14_3x3_256_256,r50_7_3x3_512_512
timeout 35 $B conv --dtype f16 --cases $C --reps 3 --sample-ms 10 --json $OUT/conv-f16.json 2>&1 | tail -30
timeout 30 $B conv --dtype f32 --cases $C --reps 3 --sample-ms 10 --json $OUT/conv-f32.json 2>&1 | tail -30
echo "== MEM $(date +%T)"
TFWGPU_LOG=warn,tfwgpu_runtime::kernels::f16conv=info timeout 60 $B ops --cases bn_train_64x56x56x256_f16,bn_grad_64x56x56x256_f16,bn_train_64x14x14x1024_f16,maxpool3s2_64x112x112x64_f16,maxpoolgrad3s2_64x112x112x64_f16,maxpoolgrad3s2_64x112x112x64,softmax_2048x32768 --reps 5 --warm-ms 300 --no-same-copy --json $OUT/mem3.json 2>&1 | tail -12
echo "== r50 replay (fused reductions trace, vec4 loads on / off) $(date +%T)"
gzip -dc bench/traces/resnet50-b2to64-reduce.trace.gz > /tmp/rf.trace
for v in 1 0; do echo "VEC_LOADS=$v"; TFWGPU_REDUCE_VEC_LOADS=$v timeout 40 $B replay /tmp/rf.trace --repeat 3 --top 40 --json $OUT/r50-vec$v.json > /tmp/r50-$v.log 2>&1; grep -E 'dispatches by kernels|steps "train_step"|GPU \(timestamps|^  _TfwgpuFused|^  (Mean|Sum|Conv2D) ' /tmp/r50-$v.log | head -24; done
echo "== torch models $(date +%T)"
timeout 60 python3 bench/torch_models.py --models cnn,resnet50 --modes f32 --layouts channels_last --steps 30 --warmup 5 --feed pageable --json $OUT/torch-models.json 2>&1 | grep -E "train" | head -4
timeout 40 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 3 --json $OUT/torch-keraslike.json 2>&1 | tail -3
echo "== keras $(date +%T)"
bash bench/gpu_host.sh run 'timeout 60 python3 bench/keras_models.py --models mlp,cnn,resnet --json $OUT/keras-small.json 2>&1 | grep batch; TFWGPU_EVENTS=completed TFWGPU_DYNAMIC_STORAGE=0 timeout 30 python3 bench/keras_models.py --models cnn --json $OUT/keras-cnn-oldevents.json 2>&1 | grep batch; timeout 30 python3 bench/keras_models.py --models cnn --steps 250 --warmup 10 --host-budget 1 --json $OUT/keras-cnn-budget.json 2>&1 | grep -v -i warn | tail -3; timeout 100 python3 bench/keras_models.py --models resnet50 --resnet50-steps 10 --resnet50-warmup 3 --json $OUT/keras-r50.json 2>&1 | grep batch'
echo "== two H200s $(date +%T)"
bash bench/gpu_host.sh run 'timeout 80 python3 bench/mirrored.py --per-gpu-batch 256 --steps 150 --json $OUT/mirrored.json 2>&1 | grep -E "images_per_s\"|speedup|step_ms_median"'
echo "== done $(date +%T)"; ls $OUT
