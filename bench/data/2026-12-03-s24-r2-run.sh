# Session 24, request s24-r2 (issue 7): two changes to Keras's fused recurrent layers after
# s24-r1, each A/B'd in one call, bench/keras_fit_reads.py (batch 64, 40 timed steps after 10;
# lstm, gru, bilstm, stack, cnn as the reference), one process each, order C A B D twice:
#   A: s24-r1's plugin (.hostrun/old) and package (.hostrun/pkg-a);
#   B: s24-r1's plugin, this package (the fused op's flat weights from one transpose per kernel,
#      `_whole_params`, instead of Keras's per-gate split / transpose / concat);
#   C: this plugin (small layers' steps fused: one dispatch per timestep) and this package;
#   D: C with TFWGPU_RNN_STEP=matmul (the MatMul steps of A and B with this binary).
# TensorFlow staged first.
#
# Prediction (written before the run): kernel calls per step B / A: lstm ~61 / 93, gru ~50 / 82,
# bilstm ~90 / 154, stack ~76 / 140 (lavapipe: lstm 61.5 / 93.5); C = D = B in kernel calls (the
# fused steps are inside the op). ms per step: B 15-30% below A on lstm and gru, 20-35% on bilstm
# and stack (~32 fewer TensorFlow kernel calls per layer at ~25-35 us each); C 3-10% below D (the
# op records ~40 fewer dispatches per layer and step, ~2-4 us each of host and GPU); cnn within
# +-15% in every setting. Losses: A = B = D bit for bit (same kernels, the weights laid out by
# other ops), C within float32 summation order (its products sum k in order). Rules: figures to
# RESULTS as measured; a change slower than its reference in both rounds on lstm and gru is
# reverted or made opt-in before the session ends.
source bench/h200/lib.sh
gunzip -f .hostrun/old/*.gz
bash bench/gpu_host.sh run "
w=/tmp/w/site-packages
use() { cp \$1/libtfwgpu_plugin.so \$w/tensorflow-plugins/ && rm -rf \$w/tensorflow_wgpu && cp -r \$2 \$w/; }
M=lstm,gru,bilstm,stack,cnn
for r in 1 2; do
  use .hostrun python/tensorflow_wgpu && python3 bench/keras_fit_reads.py --models \$M --steps 40 --json $L/reads-C-\$r.json > $L/reads-C-\$r.log 2>&1
  use .hostrun/old .hostrun/pkg-a/tensorflow_wgpu && python3 bench/keras_fit_reads.py --models \$M --steps 40 --json $L/reads-A-\$r.json > $L/reads-A-\$r.log 2>&1
  use .hostrun/old python/tensorflow_wgpu && python3 bench/keras_fit_reads.py --models \$M --steps 40 --json $L/reads-B-\$r.json > $L/reads-B-\$r.log 2>&1
  use .hostrun python/tensorflow_wgpu && TFWGPU_RNN_STEP=matmul python3 bench/keras_fit_reads.py --models \$M --steps 40 --json $L/reads-D-\$r.json > $L/reads-D-\$r.log 2>&1
done
"
for f in "$L"/reads-*.log; do echo "== $f"; grep -E '^(lstm|gru|bilstm|stack|cnn) ' "$f" | cut -c1-150; tail -3 "$f" | grep -i error; done
tar czf "$OUT/s24-r2.tgz" -C "$OUT" logs
