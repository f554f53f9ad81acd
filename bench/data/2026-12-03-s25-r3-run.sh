# Session 25, request s25-r3: request 2's model again, with PyTorch also under
# cudnn.benchmark = True (request 2 measured PyTorch's default heuristics: 10.2 ms, 2.1x slower
# than Keras on tfwgpu, which is not a fair reference). TensorFlow staged if the host is warm.
#
# Prediction (written before the run): PyTorch with benchmark 1.5-4 ms; Keras 4.5-5 ms as in
# request 2; Keras / PyTorch-benchmark 1.2-3x.
source bench/h200/lib.sh
bash bench/gpu_host.sh run "python3 bench/vol_interleaved.py --steps 20 --rounds 5 --cudnn-benchmark --json $L/vol.json > $L/vol.log 2>&1"
cat "$L/vol.log" | grep -v -i "warning\|I0000\|W0000\|self.data_adapter"
tar czf "$OUT/s25-r3.tgz" -C "$OUT" logs
