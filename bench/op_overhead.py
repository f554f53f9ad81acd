#!/usr/bin/env python3
"""Host overhead per op (issue 7): the same tiny ops on tfwgpu's /GPU:0 and on TensorFlow's
/CPU:0, eagerly and inside a tf.function, on tensors so small (4 floats) that the time is the
framework's and the plugin's, not the kernel's.

    python bench/op_overhead.py [--ops 2000] [--reps 5] [--json FILE]

Both wall time and the CPU time of the calling thread are reported: eager ops run on the
calling thread (TensorFlow's executor and the plugin's compute callback), while lavapipe
executes the GPU work on threads of its own, so the thread's CPU time is the host cost without
the adapter's execution and without the time the thread waited for a CPU on a loaded machine.

Eager: a chain of N `x = x * a + b` steps (2 ops each, each op's output feeds the next, no host
read until the end). tf.function: the same chain traced into one graph of 2N nodes. Reported:
microseconds per op (median of reps; the end-of-chain read is included once per rep). On a
software adapter (lavapipe) the GPU kernels run on the same CPU, so the GPU column also holds
lavapipe's own dispatch cost; on a hardware GPU it is the host-side work alone while the GPU
keeps up.

With TFWGPU_HOST_TIMERS=1 in the environment, the plugin times its own compute callback
(`tfwgpu_host_timers_json`): the GPU rows then also show the plugin's host time per op, split
into fetching the inputs, output shapes, output allocation (through TensorFlow) and recording
the GPU work; the rest of the GPU row's time is TensorFlow's executor for this device and
whatever lavapipe's execution takes from the same CPUs.

Inside a tf.function the ops run on TensorFlow's inter-op threads (`tf_Compute`), not on the
calling thread: each row also gives the CPU time per op of every group of threads
(/proc/self/task; `caller`, `tf_Compute`, `tfwgpu-*` = the plugin's, `other` = the rest,
e.g. the Vulkan driver's and TensorFlow's unnamed event-manager threads). On /GPU:0,
`tf_Compute` minus the plugin callback is TensorFlow's graph executor for a PluggableDevice
per op (OpKernelContext, the kernel C API's TF_Tensor wrappers, output allocation through
the BFC allocator), against the same executor's per-op time on /CPU:0. The chain must not be
fused for that (run with TFWGPU_FUSION=0; the fusion pass caps a group at 64 ops).
"""
import argparse
import json
import statistics
import time


def plugin_timers():
    """The plugin's host-time counters (None unless TFWGPU_HOST_TIMERS=1 and the plugin has them)."""
    try:
        import ctypes
        import tensorflow_wgpu

        lib = tensorflow_wgpu._plugin()
        f = getattr(lib, "tfwgpu_host_timers_json", None)
        if f is None:
            return None
        f.restype = ctypes.c_char_p
        t = json.loads(f().decode())
        return t if t.get("enabled") else None
    except Exception:  # noqa: BLE001 - the breakdown is optional
        return None


def thread_cpu():
    """{thread group: CPU seconds} of this process (see the module doc)."""
    import os
    import threading

    tck = os.sysconf("SC_CLK_TCK")
    me = threading.get_native_id()
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/stat") as f:
                st = f.read()
        except OSError:
            continue
        name = st[st.index("(") + 1 : st.rindex(")")]
        fields = st[st.rindex(")") + 2 :].split()
        if int(t) == me:
            g = "caller"
        elif name.startswith("tfwgpu"):
            g = "tfwgpu"
        elif name.startswith("tf_"):
            g = name
        else:
            g = "other"
        out[g] = out.get(g, 0.0) + (int(fields[11]) + int(fields[12])) / tck
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, default=2000, help="ops per chain (even)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json")
    a = p.parse_args(argv)
    import tensorflow as tf

    steps = max(1, a.ops // 2)
    devices = ["/CPU:0"] + (["/GPU:0"] if tf.config.list_logical_devices("GPU") else [])
    out = {"ops_per_chain": 2 * steps, "results": []}
    for dev in devices:
        with tf.device(dev):
            x0 = tf.constant([1.0, 2.0, 3.0, 4.0])
            m = tf.constant([0.5, 0.5, 0.5, 0.5])
            b = tf.constant([1.0, 1.0, 1.0, 1.0])

            def chain(x):
                for _ in range(steps):
                    x = x * m + b
                return x

            graph = tf.function(chain)
            for mode, fn in (("eager", chain), ("tf.function", graph)):
                fn(x0).numpy()  # warm-up: kernels, pipelines, tracing
                samples = []
                cpu_samples = []
                t_before = plugin_timers() if dev != "/CPU:0" else None
                g_before = thread_cpu()
                for _ in range(a.reps):
                    t0 = time.perf_counter()
                    c0 = time.thread_time()
                    y = fn(x0).numpy()
                    cpu_samples.append((time.thread_time() - c0) / (2 * steps) * 1e6)
                    samples.append((time.perf_counter() - t0) / (2 * steps) * 1e6)
                t_after = plugin_timers() if dev != "/CPU:0" else None
                g_after = thread_cpu()
                n_ops = 2 * steps * a.reps
                groups = {g: (v - g_before.get(g, 0.0)) / n_ops * 1e6 for g, v in g_after.items()}
                groups = {g: round(v, 2) for g, v in sorted(groups.items(), key=lambda kv: -kv[1]) if v > 0}
                assert abs(y[0] - 2.0) < 1e-3, y  # the chain converges to b / (1 - m) = 2
                med = statistics.median(samples)
                cpu_med = statistics.median(cpu_samples)
                row = {"device": dev, "mode": mode, "us_per_op": med, "samples": samples,
                       "thread_cpu_us_per_op": cpu_med, "thread_cpu_samples": cpu_samples,
                       "cpu_us_per_op_by_threads": groups}
                line = f"{dev:8} {mode:12} {med:8.2f} us/op ({cpu_med:.2f} us/op CPU of the calling thread)"
                line += "   [CPU us/op by threads: " + ", ".join(f"{g} {v:.2f}" for g, v in groups.items()) + "]"
                if t_before and t_after and t_after["calls"] > t_before["calls"]:
                    calls = t_after["calls"] - t_before["calls"]
                    per = lambda a_, b_: (a_ - b_) / calls / 1e3
                    plugin = {"calls": calls, "us_per_call": per(t_after["total_ns"], t_before["total_ns"])}
                    for k in t_after["phase_ns"]:
                        plugin[k + "_us"] = per(t_after["phase_ns"][k], t_before["phase_ns"][k])
                    row["plugin_host"] = plugin
                    phases = ", ".join(f"{k} {plugin[k + '_us']:.2f}" for k in t_after["phase_ns"])
                    line += f"   (plugin callback {plugin['us_per_call']:.2f} us/op: {phases})"
                out["results"].append(row)
                print(line)
    by = {(r["device"], r["mode"]): r["us_per_op"] for r in out["results"]}
    for mode in ("eager", "tf.function"):
        if ("/GPU:0", mode) in by:
            print(f"{mode}: GPU/CPU host time per op {by[('/GPU:0', mode)] / by[('/CPU:0', mode)]:.2f}x")
    rows = {(r["device"], r["mode"]): r for r in out["results"]}
    for mode in ("eager", "tf.function"):
        g = rows.get(("/GPU:0", mode), {}).get("plugin_host")
        if g and ("/CPU:0", mode) in by:
            cpu = by[("/CPU:0", mode)]
            print(f"{mode}: the plugin's own host time {g['us_per_call']:.2f} us/op against TensorFlow's "
                  f"whole op on /CPU:0 {cpu:.2f} us/op ({g['us_per_call'] / cpu:.2f}x)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
