#!/usr/bin/env bash
# host helper (issue 7: GPU bubbles). One binary (branch host); "old" = the host-side changes
# switched off by their knobs (bind-group cache, idle submit, direct uploads), which is the
# HEAD runtime's behaviour; the replay harness is the new one in both (payloads drawn before the
# clock, idle time split by batch). One tune cache for all runs: every run picks the same kernels.
set -u
export TFWGPU_TUNE_CACHE=/tmp/tfwgpu-tune.json
L=$OUT/log.txt
B=/tmp/tfwgpu-bench
gunzip -c tfwgpu-bench.gz > $B && chmod +x $B
mkdir -p /tmp/j /tmp/traces
for t in resnet50 cnn mlp resnet; do gunzip -c $t.trace.gz > /tmp/traces/$t.trace; done
( $B devices 2>&1 | head -5 ) >> $L
OLD="TFWGPU_BIND_GROUP_CACHE=0 TFWGPU_BATCH_IDLE_OPS=0 TFWGPU_DIRECT_UPLOAD_BYTES=0"
run() { # name trace repeat [env...]
  local name=$1 tr=$2 rep=$3; shift 3
  echo "== $name: replay $tr x$rep $*" >> $L
  env "$@" timeout 100 $B replay /tmp/traces/$tr --repeat $rep --top 8 --json /tmp/j/$name.json >> $L 2>&1
  echo "rc $? at $(date +%T)" >> $L
}
run r50-old resnet50.trace 3 $OLD
run r50-new resnet50.trace 3
run r50-new-noidle resnet50.trace 3 TFWGPU_BATCH_IDLE_OPS=0
run r50-new-nodirect resnet50.trace 3 TFWGPU_DIRECT_UPLOAD_BYTES=0
for m in cnn mlp resnet; do
  run $m-old $m.trace 5 $OLD
  run $m-new $m.trace 5
done
run cnn-new-nocache cnn.trace 5 TFWGPU_BIND_GROUP_CACHE=0
for v in old new; do
  E=""; [ $v = old ] && E=$OLD
  echo "== overhead $v" >> $L
  env $E timeout 30 $B overhead --calls 4096 --reps 7 --json /tmp/j/overhead-$v.json >> $L 2>&1
  env $E timeout 30 $B overhead --calls 4096 --reps 7 --default-batching --json /tmp/j/overhead-$v-batched.json >> $L 2>&1
done
python3 - <<'PY' >> $L 2>&1
import json, glob, os
out = {}
for f in sorted(glob.glob('/tmp/j/*.json')):
    out[os.path.basename(f)[:-5]] = json.load(open(f))
json.dump(out, open(os.environ['OUT'] + '/replays.json', 'w'))
print('wrote', len(out), 'results')
PY
