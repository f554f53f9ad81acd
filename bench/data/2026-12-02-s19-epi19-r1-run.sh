#!/usr/bin/env bash
# Session 19 (issue 6), branch epi19: what the cooperative epilogue costs on the float16 1x1 rows.
# Carries .gl and .hostrun/tfwgpu-bench built on branch epi19 (TFWGPU_COOP_EPI measurement forms;
# the adapter's SUBGROUP_BARRIER feature requested). Forms, one process each, GPU busy compared
# (busy agreed within 1% between processes in this morning's calls):
#   base    main's epilogue (per accumulator: coopStoreT to the subgroup's scratch,
#           workgroupBarrier, 16-byte stores of 8 halves, workgroupBarrier)
#   nostore the same with the global stores skipped (a value test that never holds): their cost
#   nobar2  the second barrier dropped (lanes may read a scratch the next coopStoreT overwrites:
#           wrong results possible; timing only)
#   nobar   both dropped (wrong results expected; timing only)
#   sgbar   both as subgroupBarrier() (OpControlBarrier at subgroup scope): timing, and whether
#           its results are exact on this driver (rel err printed by the bench)
# PREDICTION (r50_56_1x1_64_256 forward on the persistent tile, base ~58 us): nostore 35-45 us
# (the 51 MB of output at ~3.9 TB/s is 13 us of a 58 us row; its latency more), nobar 45-52,
# sgbar as nobar. DECISION: if nobar saves >= 15% on both K-64 rows (64_256 fwd, 256_64
# bwd_input), the epilogue's barriers are worth a redesign next (fewer rounds, or subgroup
# barriers if their results are exact and their memory semantics hold for workgroup memory);
# if nostore saves most and nobar little, the store pattern is the target; if neither saves
# >= 15%, the epilogue is not what holds these rows (look at the loads' latency instead).
set -u
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh
gunzip -f .hostrun/*.gz 2>/dev/null; chmod +x .hostrun/*
B=./.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-epi19.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
$B devices 2>&1 | grep -io "SUBGROUP_BARRIER" | head -1
CASES=r50_56_1x1_64_256,r50_56_1x1_256_64,r50_56_1x1_64_64,r50_14_3x3_256_256
for x in base nostore nobar2 nobar sgbar base; do
  echo "-- $x $(date +%T)"
  TFWGPU_COOP_EPI=$x timeout 120 $B conv --dtype f16 --cases $CASES --ops fwd,bwd_input --tiles auto,c128x128x64_2x4wg1f --reps 3 --sample-ms 10 --json $L/$x-$(date +%s).json > $L/$x-$(date +%s).txt 2>&1
  tail -17 $(ls -t $L/$x-*.txt | head -1)
done
tar czf $OUT/epi19-r1-logs.tgz -C $OUT logs && rm -rf $L
