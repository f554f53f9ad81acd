#!/usr/bin/env bash
# Session 20 (issue 6), ~4 min on one H200, no TensorFlow. Build main (this commit or later):
#   cargo build --release -p tfwgpu-bench
#   cargo test --release --no-run -p tfwgpu-runtime --test coop_persist   (binary -> .hostrun/coop_persist)
#   strip -o .hostrun/tfwgpu-bench target/release/tfwgpu-bench; strip -o .hostrun/tfwgpu-shader-stats \
#     target/release/tfwgpu-shader-stats; gzip -f .hostrun/*
# carry .gl and .hostrun. Why (bench/RESULTS.md, session 20): the float16 1x1 rows' epilogue is ~40%
# of their time (C's bytes at ~2.2 TB/s, unhidden), and every plan for them rests on "one
# 128 x 128 workgroup per SM", inferred from timings and register counts, never measured.
# 1. `tfwgpu-bench occupancy` (new): workgroups resident at once per workgroup size, workgroup
#    memory and live registers; `tfwgpu-shader-stats --wgsl-dir` gives each probe's real register
#    count.
# 2. The new 16-subgroup tiles with a scratch slot each (`c128x128x32_4x4wg1f`, persistent `...fp`:
#    the epilogue in 4 rounds of 16 subgroups instead of 8 of 8, K 32 in one buffer) against the
#    chooser's picks on the four 1x1 shapes, forward and input gradient, two processes; the
#    16-subgroup K-64 tile of the 3x3 rows (`c128x128x64_4x4wg1fse8`) beside them. coop_persist
#    (the H200 persistent forms, now with the new one) first.
# PREDICTION: (1) no workgroup memory: 8 of 256 (16 of 128, 4 of 512) per SM (2048 invocations);
# if the driver sizes the carve-out for occupancy, 5 of 256 at 44 KiB and 6 at 36 KiB; if it
# keeps 64 KiB (session 11's inference), 1 at 36-47 KiB and 2 at 24-30. 256 invocations at
# ~128 registers: 2 per SM; at ~184: 1. (2) registers of the new tiles 110-128 (512 invocations:
# one workgroup of 16 warps per SM); the persistent 4x4 form 48-56 us busy on r50_56_1x1_64_256
# forward (the pick, `wg1fp`, 58.5): the epilogue's ~23 us cut by a third to a half, less the K
# loop's two extra barriers; the plain 4x4 form 3-8 us slower than its persistent twin.
# DECISION: (a) if 256-invocation probes of 36-44 KiB reach >= 2 per SM at <= 128 registers,
# registers alone hold the 128 x 128 tiles at one per SM (the next lever: an 8-subgroup tile at
# <= 128 registers); if they stay at 1, workgroup memory does too, and a tile must fit the
# measured share. (b) the new persistent (or plain) tile becomes the conv chooser's pick where
# it takes `c128x128x64_2x4wg1fp` now (plain products, n > 128, >= 96 tiles, K <= 128) if its
# results are exact and it is >= 5% under that pick (busy) on r50_56_1x1_64_256 fwd and
# r50_56_1x1_256_64 bwd_input in both processes.
source bench/h200/lib.sh
export TFWGPU_TUNE_CACHE=/tmp/tune-occ20.json
timeout 120 ./.hostrun/coop_persist --test-threads 1 > $L/coop_persist.txt 2>&1; tail -3 $L/coop_persist.txt
timeout 150 $B occupancy --dump /tmp/occ1 --json $L/occ1.json > $L/occ1.txt 2>&1; cat $L/occ1.txt
timeout 100 $B occupancy --threads 256,512 --shared-kib 22,36,44 --regs 96,120,136,160,184 --dump /tmp/occ2 --json $L/occ2.json > $L/occ2.txt 2>&1; cat $L/occ2.txt
for d in occ1 occ2; do timeout 120 ./.hostrun/tfwgpu-shader-stats --wgsl-dir /tmp/$d --filter occ_ > $L/$d-stats.txt 2>&1; done
grep -h "occ_" $L/occ*-stats.txt | sed -E 's/spirv.*Register Count=([0-9]+).*Shared Memory Size=([0-9]+).*/regs \1 shared \2/' | head -80
timeout 100 ./.hostrun/tfwgpu-shader-stats --filter c128x128x32_4x4wg1f,c128x128x64_4x4wg1fse8 > $L/tile-stats.txt 2>&1
grep -E "^coop_" $L/tile-stats.txt | sed -E 's/spirv.*Register Count=([0-9]+).*Shared Memory Size=([0-9]+).*/regs \1 shared \2/'
CASES=r50_56_1x1_64_256,r50_56_1x1_256_64,r50_56_1x1_64_64,r50_56_1x1_256_128_s2
TILES=auto,c128x128x64_2x4wg1fp,c128x128x32_4x4wg1fp,c128x128x32_4x4wg1f,c128x128x64_4x4wg1fse8,c128x64x64_4x2wg1f
for x in 1 2; do
  echo "-- conv $x $(date +%T)"
  timeout 150 $B conv --dtype f16 --cases $CASES --ops fwd,bwd_input --tiles $TILES --reps 3 --sample-ms 10 --json $L/conv$x.json > $L/conv$x.txt 2>&1
  grep -E "WRONG|error" $L/conv$x.txt | head -5
done
tar czf $OUT/occ20-r1-logs.tgz -C $OUT logs && rm -rf $L
