"""TensorFlow's fused optimizer updates (ResourceApplyGradientDescent, ResourceApplyMomentum,
ResourceApplyKerasMomentum, ResourceApplyAdam, ResourceApplyRMSProp,
ResourceApplyCenteredRMSProp, ResourceApplyAdagrad, ResourceApplyAdagradV2) on GPU:0 against
CPU:0: the tf.compat.v1.train optimizers and the raw ops, several steps, inside tf.function
(the plugin's graph rewrite) and eagerly (tensorflow_wgpu/_hooks.py).

Tolerances: the expansion performs the CPU functor's operations one by one in the same order,
so additions, subtractions and multiplications round exactly as on the CPU and gradient
descent and plain momentum match bit for bit. Divisions and square roots on the GPU are within
a few ulp (WGSL allows 2.5 ulp), and grappler's arithmetic optimizer rewrites some of the
expanded graph (a / sqrt(b) -> a * rsqrt(b), hoisting the common factor lr out of Nesterov's
sum), so those updates get a few float32 ulp per step relative to the updated values:
rtol 2e-6 over four steps.
"""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import on_gpu

STEPS = 4
# The kernel of the plugin's elementwise fusion (test_fusion.py).
FUSED = "_TfwgpuFusedElementwise"
# Groups with several outputs (an optimizer's new state is both assigned and applied).
MULTI = "_TfwgpuFusedElementwiseMulti"
SHAPES = {"w": (7, 5), "b": (129,), "s": (1,)}


def _initial(seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def _grads(seed=1):
    rng = np.random.default_rng(seed)
    return [{k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()} for _ in range(STEPS)]


def _stats():
    import tensorflow_wgpu

    return tensorflow_wgpu.stats()


def _delta(before, after):
    b, a = before["gpu_ops"], after["gpu_ops"]
    return {k: a[k] - b.get(k, 0) for k in a if a[k] != b.get(k, 0)}


def _train(tf, device, make_opt, graph, init, grads):
    """STEPS updates of compat.v1 optimizer `make_opt()` on variables on `device`, fed fixed
    gradients; returns every variable and slot as numpy."""
    with tf.device(device):
        vs = {k: tf.Variable(v, name=k) for k, v in init.items()}
        opt = make_opt()

        def step(g):
            opt.apply_gradients([(g[k], vs[k]) for k in sorted(vs)])

        if graph:
            step = tf.function(step)
        for g in grads:
            step({k: tf.constant(v) for k, v in g.items()})
    out = {k: v.numpy() for k, v in vs.items()}
    for name in opt.get_slot_names():
        for k, v in vs.items():
            out[f"{k}/{name}"] = opt.get_slot(v, name).numpy()
    if hasattr(opt, "_get_beta_accumulators"):
        for i, p in enumerate(opt._get_beta_accumulators()):
            out[f"beta{i + 1}_power"] = p.numpy()
    return out, vs


# (id, optimizer factory, rtol, gpu ops the update must have run)
OPTIMIZERS = [
    ("gradient_descent", lambda tf: tf.compat.v1.train.GradientDescentOptimizer(0.1), 0, {"Mul", "Sub"}),
    ("momentum", lambda tf: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), 0, {"Mul", "AddV2", "Sub"}),
    (
        "momentum_nesterov",
        lambda tf: tf.compat.v1.train.MomentumOptimizer(0.05, 0.8, use_nesterov=True, use_locking=True),
        2e-6,
        {"Mul", "AddV2", "Sub"},
    ),
    ("adam", lambda tf: tf.compat.v1.train.AdamOptimizer(0.01), 2e-6, {"Sqrt", "RealDiv", "Square"}),
    ("rmsprop", lambda tf: tf.compat.v1.train.RMSPropOptimizer(0.01), 2e-6, {"Square", "Sub"}),
    (
        "rmsprop_momentum",
        lambda tf: tf.compat.v1.train.RMSPropOptimizer(0.01, decay=0.8, momentum=0.5, epsilon=1e-6),
        2e-6,
        {"Square", "Sub"},
    ),
    (
        "rmsprop_centered",
        lambda tf: tf.compat.v1.train.RMSPropOptimizer(0.01, momentum=0.3, centered=True),
        2e-6,
        {"Square", "Sub"},
    ),
    ("adagrad", lambda tf: tf.compat.v1.train.AdagradOptimizer(0.1), 2e-6, {"Rsqrt", "Square"}),
]


@pytest.mark.parametrize("graph", [True, False], ids=["tf_function", "eager"])
@pytest.mark.parametrize("name,make,rtol,ops", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_compat_v1_optimizer_on_gpu_matches_cpu(tf, name, make, rtol, ops, graph):
    init, grads = _initial(), _grads()
    before = _stats()
    got, vs = _train(tf, "/GPU:0", lambda: make(tf), graph, init, grads)
    ran = _delta(before, _stats())
    want, _ = _train(tf, "/CPU:0", lambda: make(tf), graph, init, grads)
    assert all(on_gpu(v.handle) for v in vs.values())
    assert sorted(got) == sorted(want)
    assert len(got) > len(SHAPES) or name == "gradient_descent", "slots compared too"
    for k in sorted(want):
        if rtol == 0:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
        else:
            np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=rtol * np.abs(want[k]).max(), err_msg=k)
    # The variables moved (the comparison is not one of untouched values).
    assert not np.array_equal(got["w"], init["w"])
    # The update's arithmetic ran as GPU kernels, once per step at least (inside tf.function,
    # as fused elementwise kernels: the plugin's fusion pass).
    for op in ops:
        assert ran.get(op, 0) >= STEPS or (graph and ran.get(FUSED, 0) + ran.get(MULTI, 0) >= STEPS), (op, ran)


def _raw_update(tf, device, op, resources, args, graph, steps=3, dtype=np.float32):
    """`steps` calls of tf.raw_ops.<op> on variables created on `device`; `args(step)` gives
    its tensor arguments. Returns the variables as numpy."""
    with tf.device(device):
        vs = {k: tf.Variable(v.astype(dtype)) for k, v in resources.items()}

        def step(kw):
            getattr(tf.raw_ops, op)(**{k: v.handle for k, v in vs.items()}, **kw)

        if graph:
            step = tf.function(step)
        for i in range(steps):
            kw = {k: (tf.constant(v.astype(dtype)) if isinstance(v, np.ndarray) else v) for k, v in args(i).items()}
            step(kw)
    return {k: v.numpy() for k, v in vs.items()}


def _rng_arrays(seed, shape, n):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


RAW = [
    (
        "keras_momentum",
        "ResourceApplyKerasMomentum",
        ("var", "accum"),
        lambda g, i: {"lr": np.float32(0.05), "grad": g, "momentum": np.float32(0.9), "use_nesterov": False},
        0,
    ),
    (
        "keras_momentum_nesterov",
        "ResourceApplyKerasMomentum",
        ("var", "accum"),
        lambda g, i: {"lr": np.float32(0.05), "grad": g, "momentum": np.float32(0.9), "use_nesterov": True},
        0,
    ),
    (
        "adam_nesterov",
        "ResourceApplyAdam",
        ("var", "m", "v"),
        lambda g, i: {
            "beta1_power": np.float32(0.9 ** (i + 1)),
            "beta2_power": np.float32(0.999 ** (i + 1)),
            "lr": np.float32(0.01),
            "beta1": np.float32(0.9),
            "beta2": np.float32(0.999),
            "epsilon": np.float32(1e-7),
            "grad": g,
            "use_nesterov": True,
        },
        2e-6,
    ),
    (
        "adagrad_v2",
        "ResourceApplyAdagradV2",
        ("var", "accum"),
        lambda g, i: {"lr": np.float32(0.1), "epsilon": np.float32(1e-7), "grad": g},
        2e-6,
    ),
    (
        "adagrad_v2_no_slot_update",
        "ResourceApplyAdagradV2",
        ("var", "accum"),
        lambda g, i: {"lr": np.float32(0.1), "epsilon": np.float32(1e-7), "grad": g, "update_slots": False},
        2e-6,
    ),
    (
        "gradient_descent",
        "ResourceApplyGradientDescent",
        ("var",),
        lambda g, i: {"alpha": np.float32(0.25), "delta": g},
        0,
    ),
]


@pytest.mark.parametrize("graph", [True, False], ids=["tf_function", "eager"])
@pytest.mark.parametrize("name,op,resources,args,rtol", RAW, ids=[r[0] for r in RAW])
def test_raw_op_on_gpu_matches_cpu(tf, name, op, resources, args, rtol, graph):
    shape = (3, 43)
    init = dict(zip(resources, _rng_arrays(2, shape, len(resources))))
    # Accumulators of squares must be positive, as the optimizers keep them.
    for k in ("v", "accum"):
        if k in init:
            init[k] = np.abs(init[k]) + 0.1
    grads = _rng_arrays(3, shape, 3)
    got = _raw_update(tf, "/GPU:0", op, init, lambda i: args(grads[i], i), graph)
    want = _raw_update(tf, "/CPU:0", op, init, lambda i: args(grads[i], i), graph)
    for k in resources:
        if rtol == 0:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
        else:
            np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=rtol * np.abs(want[k]).max(), err_msg=k)
    assert not np.array_equal(got["var"], init["var"])
    if name == "adagrad_v2_no_slot_update":
        np.testing.assert_array_equal(got["accum"], init["accum"])


@pytest.mark.parametrize("graph", [True, False], ids=["tf_function", "eager"])
def test_half_updates_round_like_the_cpu(tf, graph):
    # Both devices round every operation to half (Eigen::half computes each op in float and
    # rounds, as do the GPU's f16 kernels); sqrt and division may differ by one half ulp.
    shape = (5, 9)
    init = dict(zip(("var", "m", "v"), _rng_arrays(4, shape, 3)))
    init["v"] = np.abs(init["v"]) + 0.1
    grads = _rng_arrays(5, shape, 3)

    def args(i):
        return {
            "beta1_power": np.float16(0.9 ** (i + 1)),
            "beta2_power": np.float16(0.999 ** (i + 1)),
            "lr": np.float16(0.01),
            "beta1": np.float16(0.9),
            "beta2": np.float16(0.999),
            "epsilon": np.float16(1e-4),
            "grad": grads[i],
        }

    got = _raw_update(tf, "/GPU:0", "ResourceApplyAdam", init, args, graph, dtype=np.float16)
    want = _raw_update(tf, "/CPU:0", "ResourceApplyAdam", init, args, graph, dtype=np.float16)
    for k in init:
        assert got[k].dtype == np.float16
        np.testing.assert_allclose(
            got[k].astype(np.float32), want[k].astype(np.float32), rtol=2e-3, atol=2e-3 * np.abs(want[k]).max(), err_msg=k
        )
    assert not np.array_equal(got["var"], init["var"])


def test_control_edges_order_the_update(tf):
    """Control edges into the update (an assignment before it) and out of it (a read after
    it) still hold after the rewrite."""
    with tf.device("/GPU:0"):
        v = tf.Variable(tf.zeros([4]))
        acc = tf.Variable(tf.zeros([4]))

    @tf.function
    def f(x, g):
        first = v.assign(x)
        with tf.control_dependencies([first]):
            upd = tf.raw_ops.ResourceApplyMomentum(
                var=v.handle, accum=acc.handle, lr=tf.constant(0.5), grad=g, momentum=tf.constant(0.9)
            )
        with tf.control_dependencies([upd]):
            return v.read_value(), acc.read_value()

    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    g = np.array([2.0, -2.0, 0.5, 8.0], np.float32)
    out_v, out_acc = f(tf.constant(x), tf.constant(g))
    np.testing.assert_array_equal(out_acc.numpy(), g)  # 0 * 0.9 + g
    np.testing.assert_array_equal(out_v.numpy(), x - g * np.float32(0.5))
    np.testing.assert_array_equal(v.numpy(), x - g * np.float32(0.5))


def test_eager_shape_errors_match_tensorflow(tf):
    with tf.device("/GPU:0"):
        v = tf.Variable(tf.zeros([2, 3]))
        acc = tf.Variable(tf.zeros([3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="var and accum do not have the same shape"):
        tf.raw_ops.ResourceApplyAdagradV2(var=v.handle, accum=acc.handle, lr=0.1, epsilon=1e-7, grad=tf.zeros([2, 3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="var and delta do not have the same shape"):
        tf.raw_ops.ResourceApplyGradientDescent(var=v.handle, alpha=0.1, delta=tf.zeros([3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="alpha is not a scalar"):
        tf.raw_ops.ResourceApplyGradientDescent(var=v.handle, alpha=[0.1, 0.2], delta=tf.zeros([2, 3]))
    np.testing.assert_array_equal(v.numpy(), np.zeros([2, 3]))
    with pytest.raises(TypeError):  # raw ops take keyword arguments only, hooked or not
        tf.raw_ops.ResourceApplyGradientDescent(v.handle, 0.1, tf.zeros([2, 3]))


def test_update_without_the_hook_fails_cleanly(tf):
    """The op itself, not expanded (the generated function under the hook): the guard kernel's
    error, no crash, the variable untouched."""
    from tensorflow.python.ops import gen_training_ops

    original = gen_training_ops.resource_apply_gradient_descent.__wrapped__
    with tf.device("/GPU:0"):
        v = tf.Variable([1.0, 2.0])
    with pytest.raises(tf.errors.UnimplementedError, match="ResourceApplyGradientDescent.*tf.function"):
        original(v.handle, tf.constant(0.5), tf.constant([1.0, 1.0]))
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])


def test_cpu_variables_keep_tensorflows_kernels(tf):
    with tf.device("/CPU:0"):
        v = tf.Variable([1.0, 2.0])
    before = _stats()
    tf.raw_ops.ResourceApplyGradientDescent(var=v.handle, alpha=0.5, delta=tf.constant([1.0, 4.0]))
    np.testing.assert_array_equal(v.numpy(), [0.5, 0.0])
    assert "Sub" not in _delta(before, _stats())


def test_report_shows_no_fallback_of_the_updates(tmp_path):
    """The fallback report of a compat.v1 Adam loop, in tf.function and eagerly: the update
    nodes are placed on the GPU and nothing falls back to the CPU."""
    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent(
            """
            import numpy as np
            import tensorflow as tf
            with tf.device("/GPU:0"):
                w = tf.Variable(np.ones((3, 4), np.float32))
                opt = tf.compat.v1.train.AdamOptimizer(0.01)
                opt2 = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9)
                g = tf.constant(np.full((3, 4), 0.5, np.float32))

                @tf.function
                def step():
                    opt.apply_gradients([(g, w)])

                for _ in range(2):
                    step()
                    opt2.apply_gradients([(g, w)])
            print("w", float(tf.reduce_sum(w)))
            """
        )
    )
    out = tmp_path / "report.json"
    r = subprocess.run(
        [sys.executable, "-m", "tensorflow_wgpu.report", "--json", str(out), str(script)],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(out.read_text())
    assert d["fallbacks"] == {}, d["fallbacks"]
    ops = d["ops"]
    # Placed on the GPU inside the function (then rewritten); eagerly, the hook ran the
    # momentum update as elementwise ops on the GPU instead of the op.
    assert ops["ResourceApplyAdam"] == {"graph:GPU:0": 1}, ops["ResourceApplyAdam"]
    assert "ResourceApplyMomentum" not in ops
    assert ops["AddV2"].get("eager:GPU:0", 0) >= 2, ops["AddV2"]
    for op in ("Sqrt", "RealDiv", "Mul", "Sub"):
        runs = ops.get(op, {}).get("gpu_kernel_runs", 0)
        fused = sum(ops.get(f, {}).get("gpu_kernel_runs", 0) for f in (FUSED, MULTI))
        assert runs >= 2 or fused >= 2, (op, ops.get(op))


def test_control_edges_implied_by_inputs_still_order_assign_add(tf):
    """The same for the AssignAddVariableOp rewrite: the constant 1 is made under the control
    dependency, so grappler drops the update's own control edge as implied by that input; the
    read must still wait for the assignment."""
    with tf.device("/GPU:0"):
        v = tf.Variable(tf.zeros([3]))

    @tf.function
    def f(x):
        first = v.assign(x)
        with tf.control_dependencies([first]):
            upd = v.assign_add(tf.constant([1.0, 1.0, 1.0]), read_value=False)
        with tf.control_dependencies([upd]):
            return v.read_value()

    x = np.array([5.0, 6.0, 7.0], np.float32)
    np.testing.assert_array_equal(f(tf.constant(x)).numpy(), x + 1)
    np.testing.assert_array_equal(v.numpy(), x + 1)


def test_eager_argument_types_follow_the_op(tf):
    with tf.device("/GPU:0"):
        v = tf.Variable(np.array([1.0, 2.0], np.float16))
    # Python numbers take the type of the first tensor argument (float16 here), as the op's
    # own argument conversion does.
    tf.raw_ops.ResourceApplyGradientDescent(var=v.handle, alpha=0.5, delta=tf.constant([1.0, 2.0], tf.float16))
    np.testing.assert_array_equal(v.numpy(), np.array([0.5, 1.0], np.float16))
    # Integer updates have no kernel on a GPU in TensorFlow: its own error, no update.
    with tf.device("/GPU:0"):
        iv = tf.Variable([3, 4])
    with pytest.raises((tf.errors.InvalidArgumentError, tf.errors.NotFoundError)):
        tf.raw_ops.ResourceApplyGradientDescent(var=iv.handle, alpha=1, delta=tf.constant([1, 1]))
    np.testing.assert_array_equal(iv.numpy(), [3, 4])


@pytest.mark.parametrize("centered", [False, True], ids=["rmsprop", "rmsprop_centered"])
def test_tf1_session_training_matches_cpu(tf, centered):
    """tf.compat.v1 graph mode: a Session runs the optimizer's train op (grappler rewrites the
    session's graph as it does a function's)."""
    x = np.random.default_rng(7).standard_normal((6, 3)).astype(np.float32)
    y = np.random.default_rng(8).standard_normal((6, 1)).astype(np.float32)

    def train(device):
        with tf.Graph().as_default() as g, g.device(device):
            w = tf.compat.v1.get_variable("w", initializer=np.full((3, 1), 0.3, np.float32), use_resource=True)
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.constant(x), w) - tf.constant(y)))
            opt = tf.compat.v1.train.RMSPropOptimizer(0.05, momentum=0.5, centered=centered)
            train_op = opt.minimize(loss)
            with tf.compat.v1.Session(graph=g) as s:
                s.run(tf.compat.v1.global_variables_initializer())
                losses = [s.run([train_op, loss])[1] for _ in range(3)]
                return s.run(w), losses

    before = _stats()
    gw, gl = train("/GPU:0")
    ran = _delta(before, _stats())
    cw, cl = train("/CPU:0")
    # The update's square root ran on the GPU each step (as Rsqrt after grappler's
    # a / sqrt(b) -> a * rsqrt(b)); the loss has none.
    # (Or fused with the rest of the update.)
    assert ran.get("Sqrt", 0) + ran.get("Rsqrt", 0) + ran.get(FUSED, 0) + ran.get(MULTI, 0) >= 3, ran
    # The gradients come from MatMul and Mean on each device: float32 sums, a few ulp apart.
    np.testing.assert_allclose(gw, cw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gl, cl, rtol=1e-5)
    assert not np.allclose(gw, 0.3)
