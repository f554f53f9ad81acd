#!/usr/bin/env bash
# Session 20 (issue 6), ~2 min on one H200, no TensorFlow. Build main at f7349cd or later
# (cargo build --release -p tfwgpu-bench; strip, gzip into .hostrun); carry .gl, .hostrun.
# Why: the occupancy probe (session 20) says every 128 x 128 K-64 tile runs one workgroup per
# SM: 8 warps for `c128x128x64_2x4wg1f`, the chooser's tile for plain float16 products with
# N > 128 and K > 128, against 16 for `c128x128x64_4x4wg1fse8`, the windowed 3x3 products' tile,
# which beat every K-32 tile on long K (request occ20-r5). Plain products with long K (the 1x1
# layers at 14x14 and 7x7, and the 3x3 layers' products as plain ones) have never been run on the
# 16-subgroup tile.
# PREDICTION: on plain products with N >= 128 and K >= 512 the 16-subgroup tile 3-12% under
# `wg1f` (the windowed 3x3 rows gained that way in v6: r50_14 forward 0.0527 against 0.0603 ms);
# at K 256 within +-5%.
# DECISION: plain float16 products with N >= 128 and K >= 512 take `c128x128x64_4x4wg1fse8` if it
# is exact and >= 5% under the chooser's tile (busy) in both processes on r50_14_1x1_1024_256
# fwd, r50_7_1x1_2048_512 fwd and gemm_14_1x1_2304_256 fwd, and not more than 2% over it on any
# other plain row of the call with N >= 128 and K >= 512.
source bench/h200/lib.sh
CASES=r50_14_1x1_1024_256,r50_7_1x1_2048_512,r50_28_1x1_512_128,gemm_28_1x1_1152_128,gemm_14_1x1_2304_256,gemm_7_1x1_4608_512
TILES=auto,c128x128x64_4x4wg1fse8,c128x128x64_2x4wg1f,c128x64x64_4x2wg1f
for x in 1 2; do
  echo "-- conv $x $(date +%T)"
  TFWGPU_TUNE_CACHE=/tmp/tune-r7-$x.json timeout 150 $B conv --dtype f16 --cases $CASES --ops fwd,bwd_input --tiles $TILES --reps 3 --sample-ms 10 --json $L/conv$x.json > $L/conv$x.txt 2>&1
  grep -E "WRONG|error" $L/conv$x.txt | head -5
done
tar czf $OUT/occ20-r7-logs.tgz -C $OUT logs && rm -rf $L
