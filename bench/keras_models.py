#!/usr/bin/env python3
"""Keras end to end on one device: the reference models of tensorflow_wgpu.models (mlp, cnn,
resnet) and keras.applications.ResNet50, timed per training and inference step; optionally
captures a kernel trace of each (TFWGPU_TRACE) with step marks for `tfwgpu-bench replay`.

    python bench/keras_models.py [--models mlp,cnn,resnet,resnet50] [--device /GPU:0]
                                 [--steps 50] [--warmup 5] [--json FILE]
                                 [--trace DIR [--trace-steps 3]] [--resnet50-batch 64]
                                 [--resnet50-steps 10] [--resnet50-warmup 2]

Models: `tensorflow_wgpu.models.build` for mlp/cnn/resnet (their own optimizers: Adam, SGD
momentum, AdamW); resnet50 = keras.applications.ResNet50(weights=None, input_shape=(224, 224,
3), classes=1000) with SGD(0.01, momentum=0.9); loss: sparse categorical cross-entropy (from
logits where the model outputs logits). Batch 64 for every model (the batch of the reference
programs, and of bench/torch_models.py). Data: synthetic, one batch made once (uniform [0, 1)
28x28x1 images for the small models, normal 224x224x3 for resnet50; uniform labels), served by
`tf.data.Dataset.from_tensors(batch).repeat()` on /CPU:0: the input pipeline is on the host and
each step copies its batch to the device, as a Keras program does.

Training step time: `model.fit(ds, steps_per_epoch=W)` once (warm-up: tracing, pipeline
compiles), then `model.fit(ds, steps_per_epoch=N, epochs=1)` timed by wall clock (resnet50:
its own N and W, `--resnet50-steps/--resnet50-warmup`, its steps being long): ms/step =
wall / N (everything a step costs end to end, the epoch's final host sync included). Inference
step time: `model(x, training=False)` in a tf.function on a device-resident batch, W warm-up
calls, then N calls and one `.numpy()` of the last: wall / N.

With `--trace DIR`, each model is captured in its own process (the plugin decides whether to
trace when it is loaded: TFWGPU_TRACE must be set before TensorFlow starts): DIR/<model>.trace
holds the model's build, one warm-up training step, K (`--trace-steps`) training steps each
between a `train_step` and a `train_step_end` mark (tensorflow_wgpu.trace_mark, from a
callback's on_train_batch_begin/end: the interval from `train_step_end` to the next
`train_step` is Keras's host work between steps), an `after_train` mark, one
warm-up inference call, K inference calls each opened by an `infer_step` mark and an
`after_infer` mark. TensorFlow runs one op at a time there (inter-op threads 1), so each
kernel's traced dispatch count is exact. `tfwgpu-bench replay DIR/<model>.trace --repeat R
--json F` then reports the median `train_step` and `infer_step` intervals.

With `--host-budget R`, each model's training step is instead measured R times (fit of
`--steps` steps after the warm-up fit) with where the host time goes: wall ms per step, CPU
ms per step of each group of threads (/proc/self/task: `main` = the Python thread running
fit, i.e. Keras's loop and the eager ops; `py-other` = other Python threads, e.g. Keras's
asynchronous batch-end callbacks that read the loss; `tf_Compute` etc. = TensorFlow's
inter-op threads, which run the graph's kernels and so the plugin's compute callback;
`tfwgpu-*` = the plugin's threads; `foreign` = threads that are neither, e.g. the Vulkan
driver's (lavapipe's execution threads)), and per step the plugin's counters: kernel calls
on the device and host kernels, copies, the stream-executor calls TensorFlow made (count and
wall time inside them: syncs, events, host callbacks, memcpys, allocations), the runtime's
submits and reads (each read waits for the GPU), and with TFWGPU_HOST_TIMERS=1 the compute
callback's CPU time by phase.
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

import numpy as np

MODELS = ("mlp", "cnn", "resnet", "resnet50")
BATCH = 64


def build(keras, name):
    """(model, optimizer, outputs are logits)."""
    if name == "resnet50":
        model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
        return model, keras.optimizers.SGD(0.01, momentum=0.9), False
    from tensorflow_wgpu import models

    return models.build(keras, name)


def batch_data(name, batch, seed=0):
    rng = np.random.default_rng(seed)
    if name == "resnet50":
        x = rng.standard_normal((batch, 224, 224, 3), dtype=np.float32)
        y = rng.integers(0, 1000, batch).astype("int32")
    else:
        x = rng.random((batch, 28, 28, 1), dtype=np.float32)
        y = rng.integers(0, 10, batch).astype("int32")
    return x, y


def prepare(tf, keras, name, device, batch):
    keras.utils.set_random_seed(0)
    x, y = batch_data(name, batch)
    with tf.device("/CPU:0"):
        ds = tf.data.Dataset.from_tensors((x, y)).repeat()
    with tf.device(device):
        model, opt, logits = build(keras, name)
        model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=logits))
        xd = tf.identity(tf.constant(x))

        @tf.function
        def infer(v):
            return model(v, training=False)

    return model, ds, xd, infer


def measure(tf, keras, name, device, batch, steps, warmup):
    model, ds, xd, infer = prepare(tf, keras, name, device, batch)
    with tf.device(device):
        model.fit(ds, steps_per_epoch=warmup, epochs=1, verbose=0, shuffle=False)
        t0 = time.perf_counter()
        h = model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False)
        train = (time.perf_counter() - t0) / steps
        for _ in range(warmup):
            out = infer(xd)
        out.numpy()
        t0 = time.perf_counter()
        for _ in range(steps):
            out = infer(xd)
        out.numpy()
        inf = (time.perf_counter() - t0) / steps
    loss = float(h.history["loss"][-1])
    return {
        "batch": batch,
        "steps": steps,
        "warmup": warmup,
        "train_ms": train * 1e3,
        "infer_ms": inf * 1e3,
        "train_images_per_s": batch / train,
        "infer_images_per_s": batch / inf,
        "loss": loss,
        "finite": bool(np.isfinite(loss)),
    }


def _threads(last_cpu=False):
    """{native thread id: (name, CPU seconds)} of this process's threads; with `last_cpu`,
    (name, CPU seconds, the CPU it last ran on)."""
    tck = os.sysconf("SC_CLK_TCK")
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/stat") as f:
                st = f.read()
        except OSError:
            continue
        name = st[st.index("(") + 1 : st.rindex(")")]
        fields = st[st.rindex(")") + 2 :].split()
        # utime, stime (fields 14, 15 of stat) and the CPU it last ran on (field 39).
        cpu = (int(fields[11]) + int(fields[12])) / tck
        out[int(t)] = (name, cpu, int(fields[36])) if last_cpu else (name, cpu)
    return out


def _group(tid, name, main_tid, py_tids):
    if tid == main_tid:
        return "main"
    if tid in py_tids:
        return "py-other"
    if name.startswith("tfwgpu"):
        return name.rstrip("0123456789-") or name
    if name.startswith("tf_"):
        return name
    if name in ("python", "python3") or name.startswith("python"):
        return "foreign"
    return name.rstrip("0123456789-:") or name


def _plugin_counters():
    try:
        import tensorflow_wgpu

        s = tensorflow_wgpu.stats()
    except Exception:  # noqa: BLE001 - no plugin: /CPU:0 runs
        return None
    c = {
        "gpu_ops": sum(s["gpu_ops"].values()),
        "host_ops": sum(s["host_ops"].values()),
        "d2h": s["device_to_host"]["copies"],
        "h2d": s["host_to_device"]["copies"],
    }
    for k, v in s.get("stream_executor", {}).items():
        c[f"se.{k}"] = v["calls"]
        c[f"se.{k}.wall_us"] = v["wall_us"]
    for k, v in s.get("runtime", {}).items():
        c[f"rt.{k}"] = v
    if "sync" in s:
        c["sync.gpu_waits"] = s["sync"]["gpu_waits"]
    for k in ("small", "large"):
        if k in s["host_to_device"]:
            c[f"h2d.{k}"] = s["host_to_device"][k]["copies"]
            c[f"h2d.{k}.wall_us"] = s["host_to_device"][k]["wall_us"]
    try:
        import ctypes

        f = tensorflow_wgpu._plugin().tfwgpu_host_timers_json
        f.restype = ctypes.c_char_p
        t = json.loads(f().decode())
        if t.get("enabled"):
            c["cb.calls"] = t["calls"]
            c["cb.total_us"] = t["total_ns"] / 1e3
            for k, v in t["phase_ns"].items():
                c[f"cb.{k}_us"] = v / 1e3
    except Exception:  # noqa: BLE001 - older plugin
        pass
    return c


@contextlib.contextmanager
def _timed_has_value(tf, spent):
    """While open, the wall time of every eager `has_value()` of a dataset iterator's optional
    (Keras's loop reads the flag on the host each step: a device sync) and of reading its
    value is added to `spent["has_value"]`."""
    from tensorflow.python.data.ops import optional_ops

    opt_cls = optional_ops._OptionalImpl
    orig_has_value = opt_cls.has_value

    def has_value(self, name=None):
        if not tf.executing_eagerly():
            return orig_has_value(self, name)
        t = time.perf_counter()
        v = orig_has_value(self, name)
        b = bool(v)  # Keras's `if not ...` reads it here
        spent["has_value"] += time.perf_counter() - t
        return b

    opt_cls.has_value = has_value
    try:
        yield
    finally:
        opt_cls.has_value = orig_has_value


def host_budget(tf, keras, name, device, batch, steps, warmup, reps):
    """Per training step: wall, CPU by thread group, plugin counters (see the module doc)."""
    model, ds, xd, infer = prepare(tf, keras, name, device, batch)
    runs = []
    with tf.device(device):
        model.fit(ds, steps_per_epoch=warmup, epochs=1, verbose=0, shuffle=False)
        # Wall time inside Keras's train_function (the tf.function call plus the loop's
        # `has_value()` check and `get_value()`), and inside has_value() alone (the flag is read on
        # the host: a device sync), per step; the rest of fit's time is Keras's Python loop.
        spent = {"train_function": 0.0, "has_value": 0.0}

        def timed(fn, key):
            def wrapper(*args, **kw):
                t = time.perf_counter()
                try:
                    return fn(*args, **kw)
                finally:
                    spent[key] += time.perf_counter() - t

            return wrapper

        orig_make = model.make_train_function

        def make_train_function(force=False):
            f = orig_make(force)
            if not getattr(model.train_function, "_hostcnn_timed", False):
                model.train_function = timed(model.train_function, "train_function")
                model.train_function._hostcnn_timed = True
            return f

        model.make_train_function = make_train_function
        with _timed_has_value(tf, spent):
            runs += _budget_runs(tf, keras, model, ds, name, device, batch, steps, reps, spent)
        infer_runs = _infer_budget(infer, xd, name, device, batch, steps, reps)
        overhead = _call_overhead(tf, xd, device, steps)
    return {"batch": batch, "steps": steps, "runs": runs, "infer_runs": infer_runs,
            "call_overhead": overhead}


def _call_overhead(tf, xd, device, steps):
    """TensorFlow's fixed cost of calling a tf.function on the device, measured as the
    inference step is (N calls, one read at the end): a function that returns its input
    (no kernel), one that adds a constant (one kernel), and one of 10 chained adds (fusion
    makes them one kernel)."""
    fns = {
        "identity": tf.function(lambda v: tf.identity(v)),
        "add1": tf.function(lambda v: v + 1.0),
        "add10": tf.function(lambda v: v + 1.0 + 2.0 + 3.0 + 4.0 + 5.0 + 6.0 + 7.0 + 8.0 + 9.0 + 10.0),
    }
    out = {}
    with tf.device(device):
        for k, f in fns.items():
            for _ in range(5):
                f(xd)
            f(xd).numpy()
            t0 = time.perf_counter()
            for _ in range(steps):
                o = f(xd)
            o.numpy()
            out[k] = (time.perf_counter() - t0) / steps * 1e3
    print("   tf.function call on " + device + ", ms/call: "
          + ", ".join(f"{k} {v:.4f}" for k, v in out.items()), flush=True)
    return out


def _infer_budget(infer, xd, name, device, batch, steps, reps):
    """The inference step as measure() times it (N calls of the tf.function, one `.numpy()` of
    the last), with the same per-call breakdown: wall, CPU by thread group, plugin counters."""
    import threading

    runs = []
    for _ in range(3):
        infer(xd)
    infer(xd).numpy()
    for _ in range(reps):
        main_tid = threading.main_thread().native_id
        c0, th0 = _plugin_counters(), _threads()
        t0 = time.perf_counter()
        calls = 0.0
        for _ in range(steps):
            t = time.perf_counter()
            out = infer(xd)
            calls += time.perf_counter() - t
        t = time.perf_counter()
        out.numpy()
        last_read = time.perf_counter() - t
        wall = (time.perf_counter() - t0) / steps * 1e3
        th1, c1 = _threads(), _plugin_counters()
        py_tids = {t.native_id for t in threading.enumerate()}
        cpu = {}
        for tid, (tname, sec) in th1.items():
            g = _group(tid, tname, main_tid, py_tids)
            cpu[g] = cpu.get(g, 0.0) + (sec - th0.get(tid, (tname, 0.0))[1]) / steps * 1e3
        r = {"wall_ms": wall, "call_ms": calls / steps * 1e3, "final_read_ms": last_read * 1e3,
             "cpu_ms": {k: round(v, 3) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])}}
        if c0 is not None and c1 is not None:
            r["per_step"] = {k: round((c1[k] - c0.get(k, 0)) / steps, 3) for k in c1}
        runs.append(r)
        print(f"{name} {device} batch {batch} infer: {wall:.3f} ms/call (in the call {r['call_ms']:.3f}; "
              f"final read {r['final_read_ms']:.2f} ms once); CPU ms/call "
              + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_ms"].items() if v >= 0.005), flush=True)
        if "per_step" in r:
            ps = r["per_step"]
            print("   per call: " + ", ".join(f"{k} {v:g}" for k, v in ps.items() if v and not k.endswith("wall_us")), flush=True)
    return runs


def host_log(what, text=""):
    """With TFWGPU_HOST_LOG set: `what` = "mark" adds a mark `text` to the plugin's host log,
    "reset" drops the spans kept so far (see bench/hostlog.py)."""
    if not os.environ.get("TFWGPU_HOST_LOG"):
        return
    try:
        import ctypes

        import tensorflow_wgpu

        lib = tensorflow_wgpu._plugin()
        if what == "reset":
            lib.tfwgpu_host_log_reset()
        else:
            f = lib.tfwgpu_host_log_mark
            f.argtypes = [ctypes.c_char_p]
            f(text.encode())
    except Exception:  # noqa: BLE001 - older plugin
        pass


def _budget_runs(tf, keras, model, ds, name, device, batch, steps, reps, spent):
    import threading

    runs = []
    host_log("reset")
    with tf.device(device):
        for _ in range(reps):
            for k in spent:
                spent[k] = 0.0
            main_tid = threading.main_thread().native_id
            c0, th0 = _plugin_counters(), _threads()
            host_log("mark", "train_begin")
            t0 = time.perf_counter()
            model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False)
            wall = (time.perf_counter() - t0) / steps * 1e3
            host_log("mark", "train_end")
            th1, c1 = _threads(), _plugin_counters()
            py_tids = {t.native_id for t in threading.enumerate()}
            cpu = {}
            for tid, (tname, sec) in th1.items():
                g = _group(tid, tname, main_tid, py_tids)
                cpu[g] = cpu.get(g, 0.0) + (sec - th0.get(tid, (tname, 0.0))[1]) / steps * 1e3
            r = {"wall_ms": wall, "cpu_ms": {k: round(v, 3) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])},
                 "wall_ms_in": {k: round(v / steps * 1e3, 4) for k, v in spent.items()}}
            if c0 is not None and c1 is not None:
                r["per_step"] = {k: round((c1[k] - c0.get(k, 0)) / steps, 3) for k in c1}
            runs.append(r)
            print(f"{name} {device} batch {batch}: {wall:.3f} ms/step (in train_function "
                  f"{r['wall_ms_in']['train_function']:.3f}, of which has_value + its read "
                  f"{r['wall_ms_in']['has_value']:.3f}); CPU ms/step "
                  + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_ms"].items() if v >= 0.005), flush=True)
            if "per_step" in r:
                ps = r["per_step"]
                print("   per step: " + ", ".join(f"{k} {v:g}" for k, v in ps.items() if v and not k.endswith("wall_us")), flush=True)
                print("   SE wall us/step: " + ", ".join(f"{k[3:-8]} {v:.1f}" for k, v in ps.items() if k.startswith("se.") and k.endswith("wall_us") and v)
                      + "; h2d wall us/step: " + ", ".join(f"{k[4:-8]} {v:.1f}" for k, v in ps.items() if k.startswith("h2d.") and k.endswith("wall_us")), flush=True)
    return runs


def capture(tf, keras, name, device, batch, steps):
    """The traced run (TFWGPU_TRACE is set by the parent): see the module doc."""
    import tensorflow_wgpu

    model, ds, xd, infer = prepare(tf, keras, name, device, batch)
    if not tensorflow_wgpu.trace_mark("setup"):
        sys.exit("TFWGPU_TRACE is not set or the plugin is not loaded: no trace is written")

    class Marks(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            tensorflow_wgpu.trace_mark("train_step")

        def on_train_batch_end(self, batch, logs=None):
            tensorflow_wgpu.trace_mark("train_step_end")

        def on_train_end(self, logs=None):
            tensorflow_wgpu.trace_mark("after_train")

    with tf.device(device):
        tensorflow_wgpu.trace_mark("warmup_train")
        model.fit(ds, steps_per_epoch=1, epochs=1, verbose=0, shuffle=False)
        h = model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[Marks()], shuffle=False)
        tensorflow_wgpu.trace_mark("warmup_infer")
        infer(xd).numpy()
        for _ in range(steps):
            tensorflow_wgpu.trace_mark("infer_step")
            out = infer(xd)
        out.numpy()
        tensorflow_wgpu.trace_mark("after_infer")
    return {"loss": float(h.history["loss"][-1]), "stats": tensorflow_wgpu.stats()}


def trace_all(a, models):
    os.makedirs(a.trace, exist_ok=True)
    out = {}
    for name in models:
        path = os.path.join(a.trace, f"{name}.trace")
        env = dict(os.environ, TFWGPU_TRACE=path, TF_CPP_MIN_LOG_LEVEL="2")
        cmd = [sys.executable, os.path.abspath(__file__), "--models", name, "--device", a.device,
               "--trace-child", str(a.trace_steps), "--resnet50-batch", str(a.resnet50_batch),
               "--batch", str(a.batch)] + (["--mixed"] if a.mixed else [])
        t0 = time.perf_counter()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        dt = time.perf_counter() - t0
        if r.returncode != 0:
            sys.stderr.write(r.stderr[-4000:])
            raise SystemExit(f"trace capture of {name} failed (exit {r.returncode})")
        child = json.loads(r.stdout.strip().splitlines()[-1])
        n = sum(1 for _ in open(path))
        out[name] = {"trace": path, "lines": n, "bytes": os.path.getsize(path), "seconds": dt, **child}
        print(f"{name}: {path} ({n} lines, {os.path.getsize(path) / 1e6:.1f} MB, {dt:.0f} s), loss {child['loss']:.4f}", flush=True)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--device", default="/GPU:0")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=BATCH, help="batch of mlp/cnn/resnet")
    p.add_argument("--resnet50-batch", type=int, default=BATCH)
    p.add_argument("--resnet50-steps", type=int, default=10)
    p.add_argument("--resnet50-warmup", type=int, default=2)
    p.add_argument("--mixed", action="store_true",
                   help="Keras mixed precision (policy mixed_float16: float16 compute, float32 "
                        "variables, a loss-scale optimizer), as PyTorch's f16 mode (autocast)")
    p.add_argument("--json")
    p.add_argument("--trace", metavar="DIR", help="capture a kernel trace of each model instead of timing")
    p.add_argument("--trace-steps", type=int, default=3)
    p.add_argument("--trace-child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--host-budget", type=int, metavar="R",
                   help="measure the training step's host budget R times instead of timing (see the module doc)")
    a = p.parse_args(argv)
    models = [m for m in a.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            p.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if a.trace and a.trace_child is None:
        res = trace_all(a, models)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        return 0

    import tensorflow as tf

    if a.trace_child is not None:
        tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    if a.mixed:
        keras.mixed_precision.set_global_policy("mixed_float16")
    batch = lambda m: a.resnet50_batch if m == "resnet50" else a.batch  # noqa: E731
    if a.trace_child is not None:
        r = capture(tf, keras, models[0], a.device, batch(models[0]), a.trace_child)
        print(json.dumps(r))
        return 0

    out = {"tensorflow": tf.__version__, "keras": keras.__version__, "device": a.device,
           "policy": keras.mixed_precision.global_policy().name, "results": {}}
    try:
        import tensorflow_wgpu

        ad = [d for d in tensorflow_wgpu.adapters() if d["tensorflow_device"]]
        out["adapter"] = ad[0] if ad else None
    except Exception as e:  # the plugin is not installed: TensorFlow's own device
        out["adapter"] = None
        out["adapter_error"] = str(e)
    print(f"TensorFlow {out['tensorflow']}, Keras {out['keras']}, {a.device}: "
          f"{out['adapter']['name'] if out['adapter'] else 'no tfwgpu adapter'}", flush=True)
    for name in models:
        big = name == "resnet50"
        if a.host_budget:
            out["results"][name] = host_budget(tf, keras, name, a.device, batch(name), a.steps, a.warmup, a.host_budget)
            continue
        r = measure(tf, keras, name, a.device, batch(name), a.resnet50_steps if big else a.steps,
                    a.resnet50_warmup if big else a.warmup)
        out["results"][name] = r
        print(f"{name:9s} batch {r['batch']:3d}: train {r['train_ms']:9.3f} ms/step  infer {r['infer_ms']:9.3f} ms/step  "
              f"loss {r['loss']:.4f}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
