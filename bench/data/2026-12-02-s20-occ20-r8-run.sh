#!/usr/bin/env bash
# Session 20 (issue 6), ~1 min on one H200, no TensorFlow. Build main at a4c5a90 or later
# (cargo build --release -p tfwgpu-bench; strip, gzip into .hostrun); carry .gl, .hostrun.
# Why: request occ20-r7 ran the 16-subgroup tile `c128x128x64_4x4wg1fse8` on plain long-K
# products: 6-12% under the chooser on the forwards with >= 96 tiles of 128 x 128, 3.4% on r50_7
# (52 tiles), so its rule (which named r50_7) was not met. This is the rule for the >= 96-tile
# class, on fresh processes.
# PREDICTION: r50_14_1x1_1024_256, gemm_14_1x1_2304_256, r50_28_1x1_512_128 forward 6-9% under the
# chooser again, gemm_28 forward ~12%; gemm_7_1x1_4608_512 input gradient (K 512, 468 tiles)
# within +-3%.
# DECISION: plain float16 products with N >= 128, K >= 512 and >= 96 tiles of 128 x 128 take
# `c128x128x64_4x4wg1fse8` if it is exact and >= 5% under the chooser's tile (busy) in both
# processes on r50_14_1x1_1024_256, gemm_14_1x1_2304_256 and r50_28_1x1_512_128 forward, and
# not more than 2% over it on gemm_28_1x1_1152_128 forward and gemm_7_1x1_4608_512 input
# gradient in either process.
source bench/h200/lib.sh
CASES=r50_14_1x1_1024_256,gemm_14_1x1_2304_256,r50_28_1x1_512_128,gemm_28_1x1_1152_128,gemm_7_1x1_4608_512
for x in 1 2; do
  echo "-- conv $x $(date +%T)"
  TFWGPU_TUNE_CACHE=/tmp/tune-r8-$x.json timeout 100 $B conv --dtype f16 --cases $CASES --ops fwd,bwd_input --tiles auto,c128x128x64_4x4wg1fse8 --reps 3 --sample-ms 10 --json $L/conv$x.json > $L/conv$x.txt 2>&1
  grep -E "WRONG|error" $L/conv$x.txt | head -5
done
tar czf $OUT/occ20-r8-logs.tgz -C $OUT logs && rm -rf $L
