#!/usr/bin/env bash
# dual12 request 1 (issue 8): `--allreduce peer` ordered ON THE GPUs by an OPAQUE_FD timeline
# semaphore per direction (exported by the source H200 once, imported permanently into the
# other; the source's batch with the bucket copy signals value n, the destination's next submit
# waits for n; the host never waits for a GPU in the all-reduce), A/B against the same binary's
# host-ordered peer (`peer-host`), `exchange` (main's default) and `none`, all modes
# alternating pass by pass inside each process; lockstep (every mark drains + meets, as
# before) and `--free-run` (only the first and last marks meet; 12 steps timed as a whole)
# processes alternating in rounds; `TFWGPU_PEER_WAIT=flush` as a third process kind.
# PREDICTION (written before the run): lockstep 2 GPUs / 1: exchange 1.25-1.45x, peer-host
# 1.2-1.4x (as session 11), none 1.7-1.8x, peer (timeline) 1.55-1.7x (the 0.3-0.5 ms host
# lag per bucket gone, ~0.1 ms cross-GPU signal latency left on the last bucket);
# --free-run: none 1.85-1.95x, peer +0.05x over its lockstep figure.
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
fi
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
nvidia-smi --query-gpu=timestamp,index,clocks.sm,utilization.gpu --format=csv,noheader -lms 200 > $OUT/clocks.csv 2>/dev/null &
SMI=$!
echo "-- runtime peer test (two logical devices of the first GPU) $(date +%T)"
TFWGPU_VISIBLE_DEVICES=0 timeout 40 .hostrun/peer-test --nocapture > $OUT/peer-test.log 2>&1; echo "rc=$?" >> $OUT/peer-test.log
grep -E "^test |test result|panicked|SKIP|NOT RUN|rc=" $OUT/peer-test.log
zcat ${TR:-bench/traces/mirrored-cnn-2dev.trace.gz} > /tmp/dual12.trace
dp() {  # name limit args...
  local name=$1 lim=$2; shift 2
  left $((172 - lim)) || { echo "(time: skipped dp $name)"; return; }
  echo "-- dp $name $(date +%T)"
  env ${DPENV:-} timeout $lim $B replay /tmp/dual12.trace --data-parallel ${DPN:-1,2} --per-device-batch ${BATCH:-256} \
    --json $J/dp-$name.json "$@" > $OUT/dp-$name.log 2>&1
  echo "rc=$?" >> $OUT/dp-$name.log
  grep -E 'FALLBACK|ordered on the GPUs|check \(|rc=[1-9]|rror|panick|device\(s\)|step median' $OUT/dp-$name.log | grep -v "^  steps"
}
ALL=exchange,peer,peer-host,none
# Exact sums (every gradient read back before and after its all-reduce), each mode in its own
# process so that one failing does not hide the others; GPU order 0,1 and 1,0.
DPN=2 DPENV="TFWGPU_PEER=1" dp check-peer01 25 --allreduce peer --check --repeat 1
DPN=2 DPENV="TFWGPU_PEER=1 TFWGPU_VISIBLE_DEVICES=1,0" dp check-peer10 25 --allreduce peer --check --repeat 1
DPN=2 DPENV="TFWGPU_PEER=1" dp check-peerhost01 25 --allreduce peer-host --check --repeat 1
DPN=2 DPENV="TFWGPU_PEER=1" dp check-exchange01 25 --allreduce exchange --check --repeat 1
for r in ${ROUNDS:-a b c d}; do
  DPENV="TFWGPU_PEER=1" dp lock-$r 25 --allreduce $ALL --repeat ${REP:-15}
  DPENV="TFWGPU_PEER=1" dp free-$r 25 --allreduce $ALL --repeat ${REP:-15} --free-run
  case $r in a|c) FR= ;; *) FR=--free-run ;; esac
  DPENV="TFWGPU_PEER=1 TFWGPU_PEER_WAIT=flush" dp flush-$r 25 --allreduce peer,exchange --repeat ${REP:-15} $FR
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
