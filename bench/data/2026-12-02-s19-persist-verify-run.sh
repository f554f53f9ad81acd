#!/usr/bin/env bash
# Session 19 (issue 6), after coop1x1-sweep.sh (bench/data/2026-12-02-s19-coop1x1-*): the
# persistent tile c128x128x64_2x4wg1fp passed its device tests and ran 4-15% under its twin
# c128x128x64_2x4wg1f (GPU busy) on 7 of 8 rows of the four 1x1 cases, equal on the eighth
# (stride 2, windowed); it beat `auto` only where auto is that twin (r50_56_1x1_64_256 fwd
# 1.15x, r50_56_1x1_256_64 bwd_input 1.14x, both processes); where auto is 128 x 64 or
# 64 x 64, those stay ahead. The pre-written rule (beat auto on both rows, fwd and bwd_input)
# is therefore not met by any tile; the narrower question this asks: should the chooser swap
# its 128 x 128 pick for the persistent twin on plain products, and up to which K?
# Carries .gl and .hostrun/tfwgpu-bench (main at the session-19 start, the binary of the sweep).
# Every plain (1x1, stride 1) conv row of the bench where the chooser takes 128 x 128, fwd and
# bwd_input, both tiles named plus auto, two processes; and float16 MatMul, square sizes.
# PREDICTION: the twin wins 8-15% with K <= 256 (one to four K tiles), less with K 512+
# (r50_14 fwd K 1024, gemm_14 fwd K 2304, bwd rows with K 512), MatMul 4096+ within +-5%.
# DECISION: conv: the chooser picks the persistent twin for plain products with K <= Kmax,
# Kmax the largest K such that on every row with K <= Kmax the twin's GPU busy time is >= 5%
# under c128x128x64_2x4wg1f in both processes (none if the K <= 256 rows fail). MatMul: the
# same per square size, only if it holds at every size >= 2048.
set -u
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh
gunzip -f .hostrun/*.gz 2>/dev/null; chmod +x .hostrun/*
B=./.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-persist.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
CASES=r50_56_1x1_64_256,r50_56_1x1_256_64,r50_28_1x1_512_128,r50_14_1x1_1024_256,r50_7_1x1_2048_512,gemm_28_1x1_1152_128,gemm_14_1x1_2304_256,gemm_7_1x1_4608_512
TILES=auto,c128x128x64_2x4wg1f,c128x128x64_2x4wg1fp
for k in 1 2; do
  echo "-- conv f16 $k $(date +%T)"
  timeout 200 $B conv --dtype f16 --cases $CASES --ops fwd,bwd_input --tiles $TILES --reps 3 --sample-ms 10 --json $L/conv-$k.json > $L/conv-$k.txt 2>&1
  tail -50 $L/conv-$k.txt
  echo "-- matmul f16 $k $(date +%T)"
  timeout 150 $B matmul --dtype f16 --sizes 1024,2048,4096,8192 --tiles $TILES --reps 5 --json $L/mm-$k.json > $L/mm-$k.txt 2>&1
  tail -16 $L/mm-$k.txt
done
tar czf $OUT/persist-verify-logs.tgz -C $OUT logs && rm -rf $L
