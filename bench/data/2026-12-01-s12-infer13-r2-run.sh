#!/usr/bin/env bash
# infer13 request 2 (issue 7): the waiting host's spin of 1 ms (the branch's new default on GPUs:
# polls back to back for 50 us, then yielding the core between polls, up to 1 ms, then blocks)
# against main's 50 us, in the replay and in Keras, interleaved; and, on top of it, the idle-age
# rule that splits the replayed inference step in two submits (request 1's host log: the
# step's first part is taken at ~50 us, its submit on the submit thread takes ~80 us, and the
# closing synchronize's own submit waits for it). One release build of branch infer13.
#   main   = TFWGPU_SPIN_US=50 (main's behaviour);
#   new    = the branch's defaults (spin 1 ms);
#   ia0    = new + TFWGPU_BATCH_IDLE_US=0 (no idle-age submit: one submit per replayed step);
#   ea3    = new + TFWGPU_ENCODE_AHEAD=3 (the batch encoded in parts of 3 commands on an encoder
#            thread while recording goes on; one submit of all parts);
#   ea3ia0 = ea3 + TFWGPU_BATCH_IDLE_US=0 (one submit per replayed step, mostly encoded ahead);
#   pipe   = new, replay with --no-mark-sync (the host's pace; 3 calls then the read).
# Request folder as request 1 (bench/data/2026-12-01-s12-infer13-r1-run.sh).
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export TFWGPU_TUNE_CACHE=/tmp/tune-infer13.json
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
gunzip -c traces/cnn.trace.gz > /tmp/cnn-i13.trace
B=./.hostrun/tfwgpu-bench
V_main="TFWGPU_SPIN_US=50"
V_new="TFWGPU_LOG=warn"
V_ia0="TFWGPU_BATCH_IDLE_US=0"
V_ea3="TFWGPU_ENCODE_AHEAD=3"
V_ea3ia0="TFWGPU_ENCODE_AHEAD=3 TFWGPU_BATCH_IDLE_US=0"
V_pipe="TFWGPU_LOG=warn"
replay() { # variant round [extra env]
  eval "e=\$V_$1"
  local x=""; [ "$1" = pipe ] && x="--no-mark-sync"
  env $e ${3:-} timeout 30 $B replay /tmp/cnn-i13.trace --repeat ${REP:-15} $x --json $L/replay-$1-$2.json > $L/replay-$1-$2.txt 2>&1
  echo "$1 r$2: $(grep -E '^  (steps|chain) "infer_step":' $L/replay-$1-$2.txt | sed 's/intervals between marks, //; s/ (medians of [0-9]*)//' | tr -s ' ' | tr '\n' ' ')"
}
echo "== torch $(date +%T)"
timeout 25 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 1 --variants pageable+sync,infer --json $L/torch-kl.json > $L/torch-kl.txt 2>&1; grep -E "ms/step" $L/torch-kl.txt || tail -3 $L/torch-kl.txt
timeout 30 python3 bench/torch_infer_chain.py --json $L/torch-chain.json > $L/torch-chain.txt 2>&1; tail -1 $L/torch-chain.txt
for r in 1 2 3; do
  left 75 || { echo "(time: skipped replay round $r)"; break; }
  echo "-- replay round $r $(date +%T)"
  vs="main new ia0 ea3 ea3ia0 pipe"; [ $((r % 2)) = 0 ] && vs="pipe ea3ia0 ea3 ia0 new main"
  for v in $vs; do replay $v $r; done
done
echo "== replay host logs $(date +%T)"
for v in new ea3ia0; do
  left 85 || { echo "(time: skipped host log $v)"; break; }
  REP=8 replay $v hl TFWGPU_HOST_LOG=/tmp/hl-r-$v.json
  python3 bench/hostlog_chain.py /tmp/hl-r-$v.json --json $L/hlchain-$v.json > $L/hlchain-$v.txt 2>&1
  head -16 $L/hlchain-$v.txt
  gzip -c /tmp/hl-r-$v.json > $L/hl-replay-$v.json.gz; rm -f /tmp/hl-r-$v.json
done
KM="timeout 25 python3 bench/keras_models.py --models cnn --steps 300 --warmup 10"
for r in 1 2 3; do
  left 148 || { echo "(time: skipped keras round $r)"; break; }
  echo "-- keras round $r $(date +%T)"
  vs="main new"; [ $r = 2 ] && vs="new main"
  for v in $vs; do
    eval "e=\$V_$v"
    bash bench/gpu_host.sh run "echo -n '$v r$r: '; env $e $KM --json $L/keras-$v-$r.json 2>&1 | grep batch"
  done
done
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s)"
grep -h "ms/step" $L/torch-kl.txt; tail -1 $L/torch-chain.txt
for v in main new ia0 ea3 ea3ia0 pipe; do
  python3 - "$v" $L/replay-$v-[123].json <<'EOF'
import json, sys
v, files = sys.argv[1], sys.argv[2:]
row = []
for f in files:
    try:
        st = json.load(open(f))["steps"]
        s, c = st["infer_step"], st["infer_step"].get("chain", {})
        ms = s["ms"]
        # 3 calls, then the read (the third interval holds the read): per pass, per call
        trip = sorted(sum(ms[i:i + 3]) / 3 for i in range(0, len(ms) - 2, 3))
        row.append(f"{s['median_ms']:.3f} ({c.get('record_ms', 0):.3f}/{c.get('flush_ms', 0):.3f}/{c.get('wait_ms', 0):.3f}) 3+read {trip[len(trip) // 2]:.3f} train {st['train_step']['median_ms']:.3f}")
    except Exception as e:
        row.append(f"? {e}")
print(f"replay {v:6s}: " + " | ".join(row))
EOF
done
echo "(replay: infer step median ms (record/flush/wait), per call of 3 calls + the read, train step median)"
