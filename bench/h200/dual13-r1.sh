#!/usr/bin/env bash
# dual13 request 1 (issue 8), for the two-H200 host (nvidia-h200-x2), ~150 s, no TensorFlow.
# Session 14 ran it on ONE H200 as two logical devices (bench/data/2026-12-01-s14-dual13-r1-onegpu-*):
# peer exact 7/7, exchange exact, peer-host a wrong sum (NaN on device 1), peer-async hung after
# its check (removed since). Timings now alternate exchange, peer and none only.
# Re-runs dual12's request 1 on the merged tree (main after session 13): the first run's binary
# predated d4a7dfe (a bucket issued once every producer has been replayed, not after the last
# producer in trace order) and three of its four exact-sum checks failed.
# Carries: .gl, .hostrun/{tfwgpu-bench,peer-test} (peer-test: the runtime's tests/peer.rs binary,
# `cargo test --release -p tfwgpu-runtime --test peer --no-run`, stripped).
# Part 1 decides correctness: `--check` (every gradient read back before and after its
# all-reduce, exact sums) for peer, peer-host, peer-async and exchange, GPU orders 0,1 and 1,0,
# three processes each for peer. Any failure: peer stays a measurement mode, and its timings
# below are not reported as results.
# Part 2: lockstep and free-running rounds, modes alternating pass by pass in each process.
# PREDICTION (written before the run): every check passes; lockstep 2 GPUs / 1: exchange
# 1.2-1.4x, peer 1.45-1.6x (dual12's 1.51x, maybe a little lower now that no bucket can go
# early), peer-async +0.02..0.08x over peer (the recording thread no longer encodes and
# submits the bucket's batch: 87-154 us per bucket in request 1), none 1.7-1.8x; free-running
# +0.0..0.1x each. Decision: peer-async becomes the peer default if it is ahead of peer in at
# least 3 of 4 lockstep processes.
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
source .gl/activate.sh
gunzip -f .hostrun/*.gz 2>/dev/null
chmod +x .hostrun/*; B=$PWD/.hostrun/tfwgpu-bench
J=$OUT/json; mkdir -p $J
NG=$(nvidia-smi -L | wc -l)
nvidia-smi -L
if [ "$NG" -lt 2 ]; then
  echo "!! ONLY $NG GPU: two logical devices on one H200 (TFWGPU_VISIBLE_DEVICES=0,0): NOT two-GPU scaling"
  export TFWGPU_VISIBLE_DEVICES=0,0
  # One GPU: the 1,0 order is the same device twice (run as 0,0), and one timing round only.
  O10=0,0; ROUNDS=${ROUNDS:-a}
fi
O10=${O10:-1,0}
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
nvidia-smi --query-gpu=timestamp,index,clocks.sm,utilization.gpu --format=csv,noheader -lms 200 > $OUT/clocks.csv 2>/dev/null &
SMI=$!
echo "-- runtime peer test (two logical devices of the first GPU) $(date +%T)"
TFWGPU_VISIBLE_DEVICES=0 timeout 40 .hostrun/peer-test --nocapture > $OUT/peer-test.log 2>&1; echo "rc=$?" >> $OUT/peer-test.log
grep -E "^test |test result|panicked|SKIP|NOT RUN|rc=" $OUT/peer-test.log
zcat ${TR:-bench/traces/mirrored-cnn-2dev.trace.gz} > /tmp/dual13.trace
dp() {  # name limit args...
  local name=$1 lim=$2; shift 2
  left $((280 - lim)) || { echo "(time: skipped dp $name)"; return; }
  echo "-- dp $name $(date +%T)"
  env ${DPENV:-} timeout $lim $B replay /tmp/dual13.trace --data-parallel ${DPN:-1,2} --per-device-batch ${BATCH:-256} \
    --json $J/dp-$name.json "$@" > $OUT/dp-$name.log 2>&1
  echo "rc=$?" >> $OUT/dp-$name.log
  grep -E 'FALLBACK|ordered on the GPUs|check \(|rc=[1-9]|rror|panick|device\(s\)|step median' $OUT/dp-$name.log | grep -v "^  steps"
}
ALL=exchange,peer,none
# Exact sums, each mode in its own process so that one failing does not hide the others.
for k in 1 2 3; do
  DPN=2 DPENV="TFWGPU_PEER=1" dp check-peer01-$k 25 --allreduce peer --check --repeat 1
  DPN=2 DPENV="TFWGPU_PEER=1 TFWGPU_VISIBLE_DEVICES=$O10" dp check-peer10-$k 25 --allreduce peer --check --repeat 1
done
DPN=2 DPENV="TFWGPU_PEER=1 TFWGPU_VISIBLE_DEVICES=$O10" dp check-peerhost10 25 --allreduce peer-host --check --repeat 1
DPN=2 DPENV="TFWGPU_PEER=1" dp check-peerhost01 25 --allreduce peer-host --check --repeat 1
DPN=2 DPENV="TFWGPU_PEER=1" dp check-exchange01 25 --allreduce exchange --check --repeat 1
for r in ${ROUNDS:-a b c d}; do
  DPENV="TFWGPU_PEER=1" dp lock-$r 25 --allreduce $ALL --repeat ${REP:-15}
  DPENV="TFWGPU_PEER=1" dp free-$r 25 --allreduce $ALL --repeat ${REP:-15} --free-run
done
# Session 18 turned the 50 us idle-age rule off for one device (measured on one H200) and kept
# it for several (ExecConfig::idle_age_multi: the rule was made for the two-GPU step, session 6).
# Two lockstep rounds with it off: if the two-GPU ratios are not lower without it in both, the
# multi-device default can follow the one-device one (say so in bench/RESULTS.md, issue 7).
for r in a b; do
  DPENV="TFWGPU_PEER=1 TFWGPU_BATCH_IDLE_US=0" dp idle0-$r 25 --allreduce $ALL --repeat ${REP:-15}
done
DPN=2 DPENV="TFWGPU_PEER=1" dp check-peer01-end 25 --allreduce peer --check --repeat 1
kill $SMI 2>/dev/null
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s), $NG GPU(s)"
grep -h "test result\|panicked" $OUT/peer-test.log
grep -h "check (\|FALLBACK\|rc=[1-9]" $OUT/dp-check*.log
python3 - $J <<'PY'
import json, sys, glob, statistics as st
agg = {}
for f in sorted(glob.glob(sys.argv[1] + "/dp-*.json")):
    name = f.split("/")[-1][3:-5]
    if name.startswith("check"): continue
    kind = name.rsplit("-", 1)[0]
    d = json.load(open(f))
    rows = d["runs"]; free = any(r.get("free_run_steps") for r in rows)
    kind = kind + ("(free)" if free and kind == "flush" else "")
    out = []
    for r in rows:
        m = r["allreduce"] if r["devices"] > 1 else "1gpu"
        sub = sum((p.get("submits") or 0) for p in r.get("per_device", []))
        out.append(f'{m} {r["step_median_ms"]:.3f}ms' + (f' {r["vs_one"]:.2f}x w{r["allreduce_wait_ms_per_step"]:.2f} s{sub}' if r["devices"] > 1 else ""))
        agg.setdefault((kind, m), []).append(r["vs_one"] if r["devices"] > 1 else r["step_median_ms"])
        if r["devices"] == 1 and not free:
            ms = sorted(x for v in r["steps"].values() for x in v["ms"])
            q = lambda p: ms[int(p * (len(ms) - 1))]
            out.append(f'[1gpu steps p10 {q(.1):.2f} p50 {q(.5):.2f} p90 {q(.9):.2f} max {ms[-1]:.2f}]')
    print(f"{name:10s} " + " | ".join(out))
print("median over processes (2 GPUs / 1; 1gpu: ms):")
for (k, m), v in sorted(agg.items()):
    print(f"  {k:12s} {m:10s} {st.median(v):.3f}  ({', '.join(f'{x:.2f}' for x in v)})")
PY
# The device returns at most 8 files: everything in one archive (session 15 lost the logs).
(cd $OUT && tar czf dual13-r1.tar.gz *.log *.csv json && rm -rf *.log *.csv json)
