# Session 24, request s24-r1 (issue 7): Keras's LSTM and GRU through the plugin's fused
# recurrent op (CudnnRNNV3 / CudnnRNNBackpropV3, new) against Keras's generic while loop (the
# same binary with TFWGPU_FUSED_RNN=0, what every earlier session measured), alternating N O N O,
# one process each, bench/keras_fit_reads.py (batch 64, 40 timed steps after 10): lstm, gru
# (LSTM(64) / GRU(64) over 20 steps of 16 features), bilstm (Bidirectional(LSTM(64))), stack
# (LSTM(64, return_sequences) then GRU(64)), cnn (no recurrent layer: the reference that must
# not move). Then PyTorch's references (bench/torch_seq.py: cuDNN LSTM/GRU and per-timestep cell
# loops, float32, TF32 off) in the same call. TensorFlow staged first.
#
# Prediction (written before the run): reads per step 2 for every model both ways; TF kernel
# calls per step fused / loop: lstm ~60-120 / ~616, gru ~60-120 / ~815; ms per step fused / loop:
# lstm 2.5-5 / 12-13, gru 2.5-5 / 17-18 (the loop paid ~15 us of TensorFlow per kernel call;
# the fused op records ~100 dispatches for 20 timesteps at a few us each), bilstm 4-8 / 25-35,
# stack 4-9 / 28-35; cnn within +-15% between the two settings (the process moves it). Against
# PyTorch's cuDNN LSTM/GRU (~2.4 ms in s23-r2): fused within 1.2-2x. Losses the same both ways
# within float32 summation order. Rules: figures to RESULTS as measured; if fused is not faster
# than loop on lstm and gru in both rounds, find out why before the session ends.
source bench/h200/lib.sh
bash bench/gpu_host.sh run "
for r in 1 2; do
  python3 bench/keras_fit_reads.py --models lstm,gru,bilstm,stack,cnn --steps 40 --json $L/reads-fused-\$r.json > $L/reads-fused-\$r.log 2>&1
  TFWGPU_FUSED_RNN=0 python3 bench/keras_fit_reads.py --models lstm,gru,bilstm,stack,cnn --steps 40 --json $L/reads-loop-\$r.json > $L/reads-loop-\$r.log 2>&1
done
"
python3 bench/torch_seq.py --json $L/torch-seq.json > $L/torch-seq.log 2>&1
for f in "$L"/reads-*.log "$L"/torch-seq.log; do echo "== $f"; grep -E '^(lstm|gru|bilstm|stack|cnn|mha|lstm_loop|gru_loop) ' "$f"; tail -3 "$f" | grep -i error; done
tar czf "$OUT/s24-r1.tgz" -C "$OUT" logs
