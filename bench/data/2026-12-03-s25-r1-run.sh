# Session 25, request s25-r1 (issue 7): Keras LSTM(64) / GRU(64) on MASKED inputs
# (Embedding(1000, 16, mask_zero=True) on left-padded tokens, lengths 1..20, Keras's
# pad_sequences default) through the fused recurrent op (new: the hook packs each sequence's
# unmasked steps to its front, bench/RESULTS.md session 25) and through Keras's loop
# (use_cudnn=False: what every masked layer ran before this session), and PyTorch's packed cuDNN
# layers (pack_padded_sequence by length), all in ONE process, blocks alternating
# (bench/seq_interleaved.py, 40 steps per block, 6 rounds); the unmasked lstm as a reference to
# session 24's request 3. TensorFlow staged first.
#
# Prediction (written before the run): masked loop / masked fused 3-4.5x for both layers (the
# loop ~18-25 ms as unmasked in s24-r3; the fused path ~15 more kernel calls than unmasked:
# cumsum, scatter, gathers, selects: ~5.5-7.5 ms); masked fused / unmasked fused 1.05-1.5x;
# Keras masked fused / PyTorch packed cuDNN 1.2-2.0x (packing costs PyTorch a few launches too).
source bench/h200/lib.sh
bash bench/gpu_host.sh run "python3 bench/seq_interleaved.py --models lstm_masked,gru_masked,lstm --steps 40 --rounds 6 --json $L/seq.json > $L/seq.log 2>&1"
cat "$L/seq.log" | grep -v -i "warning\|I0000\|W0000\|self.data_adapter"
tar czf "$OUT/s25-r1.tgz" -C "$OUT" logs
