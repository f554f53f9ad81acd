#!/usr/bin/env bash
# codes-ceiling request 1 (issue 6; one H200, ~50 s, no TensorFlow). A diagnosis, not a change:
# .hostrun/bench-hack is main (ec7495c) with pool_f16n.wgsl's codes9_h replaced by MaxPool's
# packed max and every code 0 (wrong results, so its rel err column is meaningless): the float16
# argmax codes pass with the same loads and stores but none of the compare-select chain.
# .hostrun/tfwgpu-bench is main itself. The hack, built with `cargo build --release -p
# tfwgpu-bench` and reverted right after (pool_f16n.wgsl, codes9_h's body replaced):
#     fn codes9_h(v: Win9) -> Codes9 {
#         return Codes9(0u, max9_h(v));
#     }
# PREDICTION: the codes pass 52.9 us -> ~41-45 us without the chain (float16 MaxPool over the same
# loads runs 45.7 us for 128.5 MB; the codes pass moves 115.6 MB), i.e. the chain costs 8-12 us;
# if it stays at ~52 us, the chain is not the limit and the loads' pattern is.
set -u
source .gl/activate.sh 2>/dev/null || true
gunzip -f .hostrun/*.gz 2>/dev/null; chmod +x .hostrun/*
P=maxpoolgrad3s2_64x112x112x64_f16,maxpool3s2_64x112x112x64_f16
export TFWGPU_LOG=warn TFWGPU_TUNE_CACHE=/tmp/tune-cc.json
for r in main1 hack1 hack2 main2; do
  b=.hostrun/tfwgpu-bench; case $r in hack*) b=.hostrun/bench-hack;; esac
  echo "== $r"
  timeout 25 $b ops --one-copy --no-same-copy --cases $P --reps 5 --warm-ms 300 --json $OUT/$r.json 2>&1 | grep -E "^maxpool|gpu per run|^copy"
done
