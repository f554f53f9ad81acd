#!/usr/bin/env bash
# Session 20 (issue 6), ~3 min on one H200, no TensorFlow. Build main (this commit or later):
#   cargo build --release -p tfwgpu-bench; strip into .hostrun (tfwgpu-bench, tfwgpu-shader-stats); gzip
# carry .gl and .hostrun. Why (bench/RESULTS.md, session 20): the occupancy probe found one
# workgroup per SM from 28 KiB of workgroup memory (two at 20-24, three at 16), so every staged
# 1x1 tile (35-45 KiB) ran alone on its SM, including the 64 x 128 tile that session 19 took for
# "two per SM" (34.8 KiB: one). Fragments loaded from the storage buffers (occ20-r2) ran 2x
# slower. Here: the 128 x 64, 64 x 128 and 64 x 64 tiles with K tiles of 32 in one buffer
# (22-23 KiB and 14 KiB), plain and persistent, on the four 1x1 shapes, forward and input
# gradient, two processes, against the chooser's picks.
# PREDICTION: registers 100-127 for the 256-invocation K-32 tiles (two per SM), ~120-140 for
# 64 x 64 (three per SM by memory); r50_56_1x1_64_256 forward 45-52 us busy on the best of them
# (the pick, 128 x 128 persistent: 58), r50_56_1x1_256_64 forward 40-45 (the pick, 128 x 64: 48),
# r50_56_1x1_64_64 20-23 (the pick, 64 x 64 K 64: 25).
# DECISION: a tile becomes the chooser's pick for a class of rows if its results are exact and
# it is >= 5% under that class's pick (busy) in both processes on both named rows: the 128 x 128
# class (r50_56_1x1_64_256 fwd, r50_56_1x1_256_64 bwd_input), the 128 x 64 class
# (r50_56_1x1_256_64 fwd, r50_56_1x1_64_256 bwd_input), the 64 x 64 class (r50_56_1x1_64_64 fwd
# and bwd_input).
source bench/h200/lib.sh
export TFWGPU_TUNE_CACHE=/tmp/tune-occ20r3.json
timeout 100 ./.hostrun/tfwgpu-shader-stats --filter c128x64x32_4x2wg1f,c64x128x32_2x4wg1f,c64x64x32_2x2w1f > $L/tile-stats.txt 2>&1
grep -E "^coop_" $L/tile-stats.txt | sed -E 's/spirv.*Register Count=([0-9]+).*Shared Memory Size=([0-9]+).*/regs \1 shared \2/'
CASES=r50_56_1x1_64_256,r50_56_1x1_256_64,r50_56_1x1_64_64,r50_56_1x1_256_128_s2
TILES=auto,c128x128x64_2x4wg1fp,c128x64x64_4x2wg1f,c64x64x64_2x2w1fs,c128x64x32_4x2wg1f,c128x64x32_4x2wg1fp,c64x128x32_2x4wg1f,c64x128x32_2x4wg1fp,c64x64x32_2x2w1f,c64x64x32_2x2w1fp
for x in 1 2; do
  echo "-- conv $x $(date +%T)"
  timeout 250 $B conv --dtype f16 --cases $CASES --ops fwd,bwd_input --tiles $TILES --reps 3 --sample-ms 10 --json $L/conv$x.json > $L/conv$x.txt 2>&1
  grep -E "WRONG|error" $L/conv$x.txt | head -5
done
tar czf $OUT/occ20-r3-logs.tgz -C $OUT logs && rm -rf $L
