#!/usr/bin/env bash
# infer13 request 1 (issue 7): where the replayed CNN inference step's ~0.2 ms outside the
# kernels goes, and whether the host's wait for the GPU is what to shorten. One release build
# of branch infer13 (main's behaviour by default). Variants, each its own process:
#   main   = defaults (TFWGPU_SPIN_US=50: a waiting host polls 50 us, then blocks in the driver);
#   s0     = TFWGPU_SPIN_US=0 (blocks at once: the driver's wake-up latency alone);
#   s1000  = TFWGPU_SPIN_US=1000 (polls up to 1 ms, yielding the core between polls past 50 us);
#   io1    = TFWGPU_BATCH_IDLE_OPS=1 (every kernel submitted at once while the GPU is idle);
#   ia0    = TFWGPU_BATCH_IDLE_US=0 (no submit by the poller of a batch 50 us old while the GPU
#            is idle: one submit per replayed inference step, at its synchronize);
#   pipe   = main, replay with --no-mark-sync (no synchronize per step: the host's pace, as
#            PyTorch's pipelined figure and Keras's inference loop measure).
# The replay prints, per step label, `chain`: record / flush (encode + submit) / wait.
# PyTorch's CNN inference (pipelined, synced per call, with the read) first.
# Request folder: .hostrun/{libtfwgpu_plugin.so,tfwgpu-bench}, bench/{keras_models,
# torch_models,torch_infer_chain,torch_keraslike,hostlog,hostlog_chain,hostlog_path}.py,
# bench/gpu_host.sh, python/tensorflow_wgpu, traces/cnn.trace.gz.
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export TFWGPU_TUNE_CACHE=/tmp/tune-infer13.json
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
gunzip -c traces/cnn.trace.gz > /tmp/cnn-i13.trace
B=./.hostrun/tfwgpu-bench
V_main="TFWGPU_SPIN_US=50"
V_s0="TFWGPU_SPIN_US=0"
V_s1000="TFWGPU_SPIN_US=1000"
V_io1="TFWGPU_BATCH_IDLE_OPS=1"
V_ia0="TFWGPU_BATCH_IDLE_US=0"
V_pipe="TFWGPU_SPIN_US=50"
replay() { # variant round [extra env]
  eval "e=\$V_$1"
  local x=""; [ "$1" = pipe ] && x="--no-mark-sync"
  env $e ${3:-} timeout 30 $B replay /tmp/cnn-i13.trace --repeat ${REP:-15} $x --json $L/replay-$1-$2.json > $L/replay-$1-$2.txt 2>&1
  echo "$1 r$2: $(grep -E '^  (steps|chain) "infer_step":' $L/replay-$1-$2.txt | sed 's/intervals between marks, //; s/ (medians of [0-9]*)//' | tr -s ' ' | tr '\n' ' ')"
}
echo "== torch infer chain $(date +%T)"
timeout 40 python3 bench/torch_infer_chain.py --json $L/torch-chain.json > $L/torch-chain.txt 2>&1; tail -2 $L/torch-chain.txt
for r in 1 2 3; do
  left 85 || { echo "(time: skipped replay round $r)"; break; }
  echo "-- replay round $r $(date +%T)"
  for v in main s0 s1000 io1 ia0 pipe; do replay $v $r; done
done
echo "== replay host logs $(date +%T)"
for v in main s1000; do
  left 95 || { echo "(time: skipped host log $v)"; break; }
  REP=8 replay $v hl TFWGPU_HOST_LOG=/tmp/hl-r-$v.json
  python3 bench/hostlog_chain.py /tmp/hl-r-$v.json --json $L/hlchain-$v.json > $L/hlchain-$v.txt 2>&1
  cat $L/hlchain-$v.txt | head -24
  gzip -c /tmp/hl-r-$v.json > $L/hl-replay-$v.json.gz; rm -f /tmp/hl-r-$v.json
done
KM="timeout 25 python3 bench/keras_models.py --models cnn --steps 300 --warmup 10"
for r in 1 2; do
  left 140 || { echo "(time: skipped keras round $r)"; break; }
  echo "-- keras round $r $(date +%T)"
  vs="main s1000"; [ $r = 2 ] && vs="s1000 main"
  for v in $vs; do
    eval "e=\$V_$v"
    bash bench/gpu_host.sh run "echo -n '$v r$r: '; env $e $KM --json $L/keras-$v-$r.json 2>&1 | grep batch"
  done
done
if left 150; then
  echo "== torch keras-like $(date +%T)"
  timeout 25 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 1 --variants pageable+sync,infer --json $L/torch-kl.json > $L/torch-kl.txt 2>&1; grep -E "ms/step" $L/torch-kl.txt || tail -3 $L/torch-kl.txt
fi
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s)"
tail -1 $L/torch-chain.txt
for v in main s0 s1000 io1 ia0 pipe; do
  python3 - "$v" $L/replay-$v-[123].json <<'EOF'
import json, sys
v, files = sys.argv[1], sys.argv[2:]
row = []
for f in files:
    try:
        st = json.load(open(f))["steps"]
        s, c = st["infer_step"], st["infer_step"].get("chain", {})
        row.append(f"{s['median_ms']:.3f} ({c.get('record_ms', 0):.3f}/{c.get('flush_ms', 0):.3f}/{c.get('wait_ms', 0):.3f}) train {st['train_step']['median_ms']:.3f}")
    except Exception as e:
        row.append(f"? {e}")
print(f"replay infer_step {v:6s}: " + " | ".join(row) + "  (ms: infer step (record/flush/wait), train step)")
EOF
done
