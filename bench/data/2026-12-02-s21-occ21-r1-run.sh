#!/usr/bin/env bash
# Prepared in session 20 (issue 6), NOT run yet: ~2 min on one H200, no TensorFlow. Build main
# (cargo build --release -p tfwgpu-bench; strip into .hostrun, gzip); carry .gl, .hostrun.
# Why (bench/RESULTS.md, session 20, sections 7-8 of the residency entry): the 16-subgroup tile
# `c128x128x64_4x4wg1fse8` (one workgroup of 16 warps per SM) ran the plain long-K forwards whose
# chooser tile is the 128 x 64 K-64 one (8 warps, one per SM: 35.8 KiB) 4-12% faster in two
# calls (gemm_28 -12%, gemm_7 -7 to -8%, r50_28_1x1_512_128 -4 to -7%, r50_7_1x1_2048_512 -3%),
# and their input gradients (other tiles) slower. Also: the persistent 128 x 128 K-64 tile runs
# one workgroup per SM, but its launch is sized for two (`TFWGPU_COOP_PERSIST_WAVE` 264); 132 was
# never measured.
# PREDICTION: (1) the 16-subgroup tile 4-12% under the chooser on the four forwards again;
# (2) wave 132 within +-3% of 264 for the K-128 input gradients on `c128x128x64_2x4wg1fp`, and
# for the K-32 persistent picks (two per SM) 132 slower (half the SM's slots empty).
# DECISION: (1) plain float16 products with K >= 512 that the chooser gives the 128 x 64 K-64 tile
# take `c128x128x64_4x4wg1fse8` if it is exact and >= 5% under that tile (busy) in both processes
# on gemm_28_1x1_1152_128 and gemm_7_1x1_4608_512 forward and r50_28_1x1_512_128 forward, and
# not more than 2% over it on r50_7_1x1_2048_512 forward. (2) the persistent 128 x 128 K-64 tile's
# wave becomes 132 if it is >= 3% under 264 on r50_28_1x1_512_128 and gemm_28_1x1_1152_128 input
# gradients in both processes (the K-32 tiles keep 264 unless 132 wins there by the same rule).
source bench/h200/lib.sh
CASES=gemm_28_1x1_1152_128,gemm_7_1x1_4608_512,r50_28_1x1_512_128,r50_7_1x1_2048_512
for x in 1 2; do
  echo "-- tiles $x $(date +%T)"
  TFWGPU_TUNE_CACHE=/tmp/tune-a$x.json timeout 100 $B conv --dtype f16 --cases $CASES --ops fwd --tiles auto,c128x128x64_4x4wg1fse8 --reps 3 --sample-ms 10 --json $L/tiles$x.json > $L/tiles$x.txt 2>&1
  grep -E "WRONG|error" $L/tiles$x.txt | head -5
  for w in 264 132; do
    echo "-- wave $w $x $(date +%T)"
    TFWGPU_COOP_PERSIST_WAVE=$w TFWGPU_TUNE_CACHE=/tmp/tune-w$w-$x.json timeout 100 $B conv --dtype f16 --cases r50_28_1x1_512_128,gemm_28_1x1_1152_128,r50_56_1x1_64_256,r50_56_1x1_256_64,r50_56_1x1_64_64 --ops fwd,bwd_input --reps 3 --sample-ms 10 --json $L/wave$w-$x.json > $L/wave$w-$x.txt 2>&1
    grep -E "WRONG|error" $L/wave$w-$x.txt | head -5
  done
done
tar czf $OUT/occ21-r1-logs.tgz -C $OUT logs && rm -rf $L
