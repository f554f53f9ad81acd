# Session 23, request s23-r3 (issue 7): the session's final plugin (new, ce9744c: loop bodies
# fused, SigmoidGrad/TanhGrad in programs, MatrixBandPart, image resizes) against request
# s23-r1's new plugin (old here, 7335b89: Einsum, loop conditions on the host, the larger host
# mirror), alternating N O N O, one process each, bench/keras_fit_reads.py (batch 64, 40 timed
# steps): lstm and gru (loop fusion), causal (a transformer block with a causal mask:
# MatrixBandPart), upsample (bilinear UpSampling2D and Resizing), mha (unchanged: regressions
# only). TensorFlow staged first.
#
# Prediction (written before the run): kernels per step new / old as on lavapipe: lstm ~617 /
# 1037, gru ~816 / 1336; ms per step new / old: lstm 8-13 / 13-19, gru 15-20 / 25-26 (the
# per-op cost, ~12-18 us per kernel on this host, times the kernels saved); causal: reads 2 / 2-4
# (old: the mask on the CPU, its inputs constants), ms new <= old; upsample: reads 2 / 4-6 (old:
# the resizes and their gradients on the CPU, the activations copied each way), ms new 10-40%
# below old; mha within +-10% in the same round. Same losses new and old within float32
# summation order. Rules: figures to RESULTS as measured; a model new slower than old in both
# rounds by more than 10% is investigated before the session ends.
source bench/h200/lib.sh
gunzip -f .hostrun/old/*.gz
bash bench/gpu_host.sh run "
w=/tmp/w/site-packages
use() { cp \$1/libtfwgpu_plugin.so \$w/tensorflow-plugins/ && rm -rf \$w/tensorflow_wgpu && cp -r \$2 \$w/; }
for r in 1 2; do
  use .hostrun python/tensorflow_wgpu && python3 bench/keras_fit_reads.py --models lstm,gru,causal,upsample,mha --steps 40 --json $L/reads-new-\$r.json > $L/reads-new-\$r.log 2>&1
  use .hostrun/old .hostrun/old/tensorflow_wgpu && python3 bench/keras_fit_reads.py --models lstm,gru,causal,upsample,mha --steps 40 --json $L/reads-old-\$r.json > $L/reads-old-\$r.log 2>&1
done
"
for f in "$L"/reads-*.log; do echo "== $f"; grep -E '^(lstm|gru|causal|upsample|mha) ' "$f"; tail -2 "$f" | grep -i error; done
tar czf "$OUT/s23-r3.tgz" -C "$OUT" logs
