#!/usr/bin/env bash
# Session 19 (issue 6), branch epi19, request 5 (a measurement for planning; nothing is decided
# by it). r50_56_1x1_64_256's product (M 100352, N 256) with K of 1, 2, 4 and 8 K tiles of 64
# (new cases k_56_1x1_{128,256,512}_256 on the branch), forward, on the plain 128 x 128 tile and
# its persistent twin, with main's epilogue (base) and with its stores skipped (nostore):
# time(K) = fixed + per-K-tile x K/64 splits the row into the part that grows with K (staging
# and products) and the part each tile pays once (first loads, epilogue).
# PREDICTION: per K tile ~15 us over the grid (v10's ladder: ~1.3 us of SM time per 128 x 128 x
# 64 K tile, 1568 tiles on 132 SMs), fixed ~43 us at K 64 (58 - 15); nostore lowers the fixed
# part only (by ~11 us).
set -u
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh
gunzip -f .hostrun/*.gz 2>/dev/null; chmod +x .hostrun/*
B=./.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-epi19.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
CASES=r50_56_1x1_64_256,k_56_1x1_128_256,k_56_1x1_256_256,k_56_1x1_512_256
for x in base nostore; do
  echo "-- $x $(date +%T)"
  TFWGPU_COOP_EPI=$x timeout 100 $B conv --dtype f16 --cases $CASES --ops fwd --tiles c128x128x64_2x4wg1f,c128x128x64_2x4wg1fp --reps 3 --sample-ms 10 --json $L/$x.json > $L/$x.txt 2>&1
  grep -vE "WRONG" $L/$x.txt | tail -9
done
tar czf $OUT/epi19-r5-logs.tgz -C $OUT logs && rm -rf $L
