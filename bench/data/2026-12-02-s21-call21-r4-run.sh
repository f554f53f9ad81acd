#!/usr/bin/env bash
# Session 21 (issue 7): what makes some processes' Keras inference calls slow. call21-r2's second
# process ran the CNN's calls at 0.38 ms against 0.27 in the first while its identity calls and
# PyTorch's ran as fast as in the first (0.157 / 0.155 ms): our share of a call (model - identity)
# doubled there. TensorFlow staged first; carry .gl, .hostrun (release plugin).
# Five processes of `bench/call_path.py infer --alternate 3` (identity and CNN blocks alternating,
# then one timed window with the plugin's runtime counters per call and each busy thread's last
# CPU), the last one with the host log.
# PREDICTION: at least one of the five is slow (model - identity >= 1.5x the fastest process's);
# its counters per call are those of the fast ones (9 dispatches, 0 bind groups created, ~0.3
# submits): the slowness is the host's (where the threads run), not extra GPU work or cache misses.
# DECISION: if a slow process creates bind groups or records copies per call that a fast one does
# not, that is the next work (issue 7); if not, record the thread placement and leave it.
source bench/h200/lib.sh
lscpu | grep -E "^CPU\(s\)|Thread|Core|Socket|NUMA|Model name" ; lscpu -e 2>/dev/null | head -20
for k in 1 2 3 4; do
  echo "-- process $k $(date +%T)"
  bash bench/gpu_host.sh run "timeout 100 python3 bench/call_path.py infer --alternate 3" 2>&1 | grep -E "^identity|^cnn|^alternating|^CPU|^last|^runtime|Error"
done
echo "-- process 5, host log $(date +%T)"
bash bench/gpu_host.sh run "TFWGPU_HOST_LOG=$L/hl-cnn-5.json timeout 100 python3 bench/call_path.py infer --alternate 3" 2>&1 | grep -E "^identity|^cnn|^alternating|^CPU|^last|^runtime|Error"
python3 bench/call_path.py analyze $L/hl-cnn-5.json > $L/hl-cnn-5.txt 2>&1; head -30 $L/hl-cnn-5.txt; gzip -f $L/hl-cnn-5.json
echo "== done $(date +%T)"
tar czf $OUT/call21-r4-logs.tgz -C $OUT logs
