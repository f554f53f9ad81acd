# Session 24, request s24-r2 (issue 7): the fused recurrent op's flat weights built by the
# Python package's hook from one transpose per kernel (new package, `_whole_params`) against
# Keras's per-gate split / transpose / concat (old package: request s24-r1's), the same plugin
# binary, alternating N O N O, one process each, bench/keras_fit_reads.py (batch 64, 40 timed
# steps after 10): lstm, gru, bilstm, stack, cnn (reference). TensorFlow staged first.
#
# Prediction (written before the run): kernel calls per step new / old: lstm ~61 / 93, gru ~50 /
# 82, bilstm ~90 / 154, stack ~76 / 140 (lavapipe: lstm 61.5 / 93.5); ms per step: new 15-30%
# below old on lstm and gru (~32 fewer TensorFlow kernel calls at ~25-35 us each out of 3.2-6.3
# ms), 20-35% on bilstm and stack; cnn within +-15% (unchanged). Same losses new and old
# (bit-identical: the same values, laid out by other ops). Rules: figures to RESULTS as
# measured; a model new slower than old in both rounds is investigated before the session ends.
source bench/h200/lib.sh
bash bench/gpu_host.sh run "
w=/tmp/w/site-packages
pkg() { rm -rf \$w/tensorflow_wgpu && cp -r \$1 \$w/; }
for r in 1 2; do
  pkg python/tensorflow_wgpu && python3 bench/keras_fit_reads.py --models lstm,gru,bilstm,stack,cnn --steps 40 --json $L/reads-new-\$r.json > $L/reads-new-\$r.log 2>&1
  pkg .hostrun/pkg-a/tensorflow_wgpu && python3 bench/keras_fit_reads.py --models lstm,gru,bilstm,stack,cnn --steps 40 --json $L/reads-old-\$r.json > $L/reads-old-\$r.log 2>&1
done
"
for f in "$L"/reads-*.log; do echo "== $f"; grep -E '^(lstm|gru|bilstm|stack|cnn) ' "$f" | cut -c1-160; tail -3 "$f" | grep -i error; done
tar czf "$OUT/s24-r2.tgz" -C "$OUT" logs
