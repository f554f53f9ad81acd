#!/usr/bin/env bash
# Session 21 (issue 7, the inference goal): where a Keras inference call's host time goes on the
# H200 host. TensorFlow staged first (bench/gpu_host.sh stage-tf / install-tf); carry .gl and
# .hostrun (release plugin, bench). Session 18 put the CNN call at 1.67-1.96x PyTorch's and an
# identity tf.function at 0.15-0.19 ms; the 7 kernels add ~0.18 ms per call there, but the
# plugin's callbacks summed ~52 us per call on lavapipe's slower 2-core host (bench/call_path.py
# analyze, this session) and TensorFlow's executor leaves ~1-3 us between them: the rest of the
# 0.18 ms was never located on the H200 host.
# PREDICTION: identity 150-190 us/call; CNN (batch 64) 300-400; callbacks 25-50 us per call in
# sum, gaps between them 1-3 us; so the last-callback -> next-call gap (TensorFlow's per-call
# path with the model's captured variables as inputs) 220-330 us. CNN at batch 1 on /CPU:0
# within 30% of ours at batch 1 (TensorFlow's per-call path is the same). slope per op: /CPU:0
# 1-3 us, /GPU:0 (fusion off) 5-12 us.
# DECISION: if the per-call gap outside the callbacks is >= 60% of the call, the plugin's callbacks
# are not the lever (note it, issue 7); if the callbacks are >= 40% of the call, their
# pre-dispatch part is the next work (shape checks, allocation, plan lookup).
source bench/h200/lib.sh
P="bash bench/gpu_host.sh run"
for d in /CPU:0 /GPU:0; do
  echo "-- slope $d $(date +%T)"
  $P "TFWGPU_FUSION=0 timeout 100 python3 bench/call_path.py slope --device $d" 2>&1 | grep -E "^slope|Error" | tail -6
done
for k in 1 2; do
  for d in /CPU:0 /GPU:0; do
    echo "-- infer batch 1 $d $k $(date +%T)"
    $P "timeout 100 python3 bench/call_path.py infer --device $d --batch 1" 2>&1 | grep -E "^identity|^cnn|^CPU|Error" | tail -5
  done
  echo "-- infer batch 64 /GPU:0 $k, host log $(date +%T)"
  $P "TFWGPU_HOST_LOG=$L/hl-cnn-$k.json timeout 100 python3 bench/call_path.py infer" 2>&1 | grep -E "^identity|^cnn|^CPU|Error" | tail -5
  python3 bench/call_path.py analyze $L/hl-cnn-$k.json > $L/hl-cnn-$k.txt 2>&1; cat $L/hl-cnn-$k.txt
  gzip -f $L/hl-cnn-$k.json
  echo "-- infer batch 64 /GPU:0 $k, no log $(date +%T)"
  $P "timeout 100 python3 bench/call_path.py infer" 2>&1 | grep -E "^identity|^cnn|^CPU|Error" | tail -5
done
echo "== done $(date +%T)"
tar czf $OUT/call21-r1-logs.tgz -C $OUT logs
