#!/usr/bin/env bash
# Session 17 request 3 (issue 8), one H200, ~2.5 min, no TensorFlow. Carries .gl and
# .hostrun/{tfwgpu-bench,tfwgpu-bench-old}.gz: main at 68f1fac, and the same tree with f7d5dfb's
# replay_dp.rs (before 01aa97c's waiting rule).
# Does the fixed waiting rule (every event touching a gradient until its memory is rewritten
# waits for the bucket's sum, not only the first consumer) cost step time? Two logical devices
# of one H200 (TFWGPU_VISIBLE_DEVICES=0,0): NOT two-GPU scaling; the same GPU shared, so only
# new against old matters here. Lockstep, per-device batch 256, peer and none alternating pass
# by pass after a one-GPU pass, three ABBA pairs of processes.
# PREDICTION (written before the run): peer step time within +-5% between the binaries (the
# extra waiters are held back, not blocking; the first waiter already waited before); none
# identical (no all-reduce, no waits).
set -u
source .gl/activate.sh
gunzip -f .hostrun/*.gz 2>/dev/null
chmod +x .hostrun/*
B=./.hostrun/tfwgpu-bench
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 250 > $L/smi.csv 2>&1 &
SMI=$!
zcat bench/traces/mirrored-cnn-2dev.trace.gz > /tmp/s17.trace
run() { # name binary
  echo "-- $1 $(date +%T)"
  TFWGPU_PEER=1 TFWGPU_VISIBLE_DEVICES=0,0 timeout 40 $2 replay /tmp/s17.trace --data-parallel 1,2 \
    --per-device-batch 256 --allreduce peer,none --repeat 15 --json $L/$1.json > $L/$1.log 2>&1
  echo "rc=$?" >> $L/$1.log
  grep -E "rc=[1-9]|rror|panick" $L/$1.log
}
run new1 $B; run old1 $B-old; run old2 $B-old; run new2 $B; run new3 $B; run old3 $B-old
kill $SMI 2>/dev/null
python3 - $L <<'PY'
import json, sys, glob, statistics as st
agg = {}
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    name = f.split("/")[-1][:-5]
    d = json.load(open(f))
    out = []
    for r in d["runs"]:
        m = r["allreduce"] if r["devices"] > 1 else "1gpu"
        out.append(f'{m} {r["step_median_ms"]:.3f}ms' + (f' w{r["allreduce_wait_ms_per_step"]:.3f}' if r["devices"] > 1 else ""))
        agg.setdefault((name[:3], m), []).append(r["step_median_ms"])
    print(f"{name:6s} " + " | ".join(out))
print("median over processes, step ms:")
for (k, m), v in sorted(agg.items()):
    print(f"  {k} {m:6s} {st.median(v):.3f}  ({', '.join(f'{x:.3f}' for x in v)})")
PY
(cd $OUT && tar czf s17-r3.tar.gz logs && rm -rf logs)
