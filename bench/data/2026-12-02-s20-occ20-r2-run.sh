#!/usr/bin/env bash
# Session 20 (issue 6), ~3 min on one H200, no TensorFlow. Build main (this commit or later):
#   cargo build --release -p tfwgpu-bench; strip into .hostrun (tfwgpu-bench, tfwgpu-shader-stats); gzip
# carry .gl and .hostrun. Why (bench/RESULTS.md, session 20, occ20-r1): this driver keeps one
# workgroup per SM as soon as a workgroup declares > ~24 KiB of workgroup memory (the probe: 2
# per SM at 20-24 KiB, 1 from 28 KiB, whatever the registers), so every staged 1x1 tile
# (35-45 KiB) runs alone on its SM, its loads, products and epilogue in sequence. The experiment
# `tfwgpu-bench coopdirect` (new, not in the runtime): cooperative fragments loaded straight
# from the storage buffers, only the epilogue's scratch in workgroup memory (4-16 KiB), so
# several workgroups per SM, with the operands' reuse from L1. Against the chooser's picks on the
# same products (the conv bench's forward of the three 1x1 shapes), two processes each.
# PREDICTION: the direct tiles' registers 70-130 (the 4-accumulator tiles ~70-90: three
# workgroups of 256 per SM); the best direct tile 35-50 us busy on 100352:256:64 (the pick: 58)
# if the fragment loads hit L1, 60-90 if each 16 x 16 fragment load (16 rows of 32 bytes) costs
# as a global gather; 100352:64:256 within +-15% of the pick (48 us: K 256, four times the
# loads per output).
# DECISION: if the best direct tile is exact and >= 15% under the pick (busy, both processes)
# on 100352:256:64 and on 100352:64:256, the next session adds a direct form to the generator
# (plain float16 products with small K) and the chooser takes it by the same rule on the conv
# bench; otherwise it is recorded and not pursued.
source bench/h200/lib.sh
timeout 60 $B coopdirect --dump /tmp/cd --shapes 16:16:16 > /dev/null 2>&1
timeout 100 ./.hostrun/tfwgpu-shader-stats --wgsl-dir /tmp/cd --filter coop_direct > $L/cd-stats.txt 2>&1
grep -E "^coop_direct" $L/cd-stats.txt | sed -E 's/spirv.*Register Count=([0-9]+).*Shared Memory Size=([0-9]+).*/regs \1 shared \2/'
for x in 1 2; do
  echo "-- $x $(date +%T)"
  timeout 150 $B coopdirect --json $L/cd$x.json > $L/cd$x.txt 2>&1; cat $L/cd$x.txt
  timeout 100 $B conv --dtype f16 --cases r50_56_1x1_64_256,r50_56_1x1_256_64,r50_56_1x1_64_64 --ops fwd --reps 3 --sample-ms 10 --json $L/conv$x.json > $L/conv$x.txt 2>&1; cat $L/conv$x.txt
done
tar czf $OUT/occ20-r2-logs.tgz -C $OUT logs && rm -rf $L
