#!/usr/bin/env python3
"""What TensorFlow runs per Keras fit step of `bench/keras_floor.py`'s Dense(1) model, by device
(issue 7: the ~0.9 ms per step our device adds to a trivial model).

    TF_DUMP_GRAPH_PREFIX=DIR TF_DUMP_GRAPH_NAME_FILTER='*' \
        python3 bench/floor_graph.py [--device /GPU:0] [--steps 20] [--json F] [--trace DIR]

Runs the floor's model (Dense(1), SGD, mse, `jit_compile=False`, a repeated `tf.data` batch on
the host), times one `fit` of `--steps` steps (with our plugin: its counters over that fit,
tfwgpu_stats_json: stream-executor calls, copies, syncs), then runs one more under
`tf.profiler` and prints per step the trace's events (executor nodes by device, function
calls, eager ops, copies), and the partition graphs of Keras's train function that TensorFlow
dumped (TF_DUMP_GRAPH_PREFIX): nodes and ops per device, the _Send/_Recv edges between them.
"""
import argparse
import collections
import json
import os
import sys
import time

import numpy as np


def plugin_stats():
    try:
        import tensorflow_wgpu

        return tensorflow_wgpu.stats()
    except Exception:  # noqa: BLE001 - not our device / older package
        return None


def diff(a, b):
    if isinstance(a, dict) and isinstance(b, dict):
        out = {}
        for k in b:
            if k in a:
                d = diff(a[k], b[k])
                if d not in (0, {}, None):
                    out[k] = d
            elif b[k] not in (0, {}, None):
                out[k] = b[k]
        return out
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return b - a
    return None


def scale(d, n):
    if isinstance(d, dict):
        return {k: scale(v, n) for k, v in d.items()}
    if isinstance(d, (int, float)):
        return round(d / n, 3)
    return d


def partitions(prefix):
    """The partition graphs TensorFlow dumped (TF_DUMP_GRAPH_PREFIX) for Keras's train function:
    per device, node count, ops, and the _Send/_Recv edges."""
    import glob
    import re

    from tensorflow.core.framework import graph_pb2
    from google.protobuf import text_format

    out = {}
    if not prefix:
        return out
    files = sorted(glob.glob(os.path.join(prefix, "*multi_step_on_iterator*_partition_*after_partition_passes*")))
    for f in files:
        m = re.search(r"(__inference_multi_step_on_iterator_\d+)_partition__.*device:([A-Z]+:\d+)", f)
        if not m:
            continue
        g = graph_pb2.GraphDef()
        text_format.Parse(open(f).read(), g, allow_unknown_field=True)
        ops = collections.Counter(n.op for n in g.node)
        sr = []
        for n in g.node:
            if n.op in ("_Send", "_Recv", "_HostSend", "_HostRecv"):
                sr.append(f"{n.op} {n.attr['tensor_name'].s.decode()} "
                          f"{n.attr['send_device'].s.decode().split('device:')[-1]}->{n.attr['recv_device'].s.decode().split('device:')[-1]}"
                          f" {tf_dtype(n.attr['tensor_type'].type)}")
        out.setdefault(m.group(1), {})[m.group(2)] = {"nodes": len(g.node), "ops": dict(ops), "send_recv": sr}
    return out


def tf_dtype(t):
    from tensorflow.python.framework import dtypes

    try:
        return dtypes.as_dtype(t).name
    except Exception:  # noqa: BLE001
        return str(t)


def trace_counts(logdir, steps):
    """Events of the profiler's trace (xplane), per step: (count, mean us) by plane, line and name."""
    import glob

    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    files = sorted(glob.glob(os.path.join(logdir, "plugins/profile/*/*.xplane.pb")))
    if not files:
        return {}
    xs = xplane_pb2.XSpace()
    xs.ParseFromString(open(files[-1], "rb").read())
    acc = collections.defaultdict(lambda: [0, 0.0])
    for pl in xs.planes:
        names = {k: v.name for k, v in pl.event_metadata.items()}
        for ln in pl.lines:
            for ev in ln.events:
                nm = names.get(ev.metadata_id, "?")
                nm = nm.split(":")[-1] if ":" in nm and len(nm) > 60 else nm
                k = f"{pl.name.split('/')[-1]} / {ln.name[:24]}: {nm[:80]}"
                acc[k][0] += 1
                acc[k][1] += ev.duration_ps / 1e6
    rows = sorted(acc.items(), key=lambda kv: -kv[1][0])
    return {k: (c / steps, tot / c if c else 0.0) for k, (c, tot) in rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="/GPU:0")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--json")
    ap.add_argument("--trace", help="profiler log folder (default /tmp/floor_graph_trace)")
    a = ap.parse_args(argv)
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).standard_normal((a.batch, 1)).astype(np.float32)
    y = (2.0 * x + 1.0).astype(np.float32)
    with tf.device("/CPU:0"):
        ds = tf.data.Dataset.from_tensors((x, y)).repeat()
    with tf.device(a.device):
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", jit_compile=False)
        model.fit(ds, steps_per_epoch=20, epochs=1, verbose=0)
        s0 = plugin_stats()
        t0 = time.perf_counter()
        model.fit(ds, steps_per_epoch=a.steps, epochs=1, verbose=0)
        wall = (time.perf_counter() - t0) / a.steps * 1e3
        s1 = plugin_stats()
        logdir = a.trace or "/tmp/floor_graph_trace"
        tf.profiler.experimental.start(logdir)
        model.fit(ds, steps_per_epoch=a.steps, epochs=1, verbose=0)
        tf.profiler.experimental.stop()
    out = {"device": a.device, "steps": a.steps, "fit_ms_per_step_unprofiled": wall}
    out["function_partitions"] = partitions(os.environ.get("TF_DUMP_GRAPH_PREFIX"))
    out["trace_per_step"] = trace_counts(logdir, a.steps)
    if s0 is not None and s1 is not None:
        out["plugin_per_step"] = scale(diff(s0, s1), a.steps)
    print(f"{a.device}: fit Dense(1) {wall:.3f} ms/step (unprofiled, {a.steps} steps)")
    for name, parts in out["function_partitions"].items():
        print(f"function {name}: {len(parts)} partitions")
        for dev, p in parts.items():
            print(f"  {dev}: {p['nodes']} nodes: " + ", ".join(f"{k} {v}" for k, v in sorted(p["ops"].items())))
            for s in p["send_recv"]:
                print(f"     {s}")
    print("profiler events per step (plane / line: name), top 60 by count:")
    for k, v in list(out["trace_per_step"].items())[:60]:
        print(f"  {v[0]:7.2f} x {v[1]:8.1f} us  {k}")
    if "plugin_per_step" in out:
        print("plugin counters per step (unprofiled fit):")
        print(json.dumps(out["plugin_per_step"], indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
