// Row-wise softmax family over a [rows, cols] view: Softmax, LogSoftmax and the two softmax
// cross-entropies, all numerically stable (the row maximum is subtracted before exp).
//
// A workgroup of 256 invocations holds p.g groups of p.t invocations (p.t a power of two);
// each group computes one row: the maximum, then the sum of exp(x - max) (and for the dense
// cross-entropy the loss sum), each first per invocation over a strided part of the row and
// then by a tree in shared memory; then the outputs of the row.
//
// Placeholders filled in by softmax.rs: MODE (0 Softmax, 1 LogSoftmax, 2 sparse
// cross-entropy, 3 dense cross-entropy), DECLS (the tensor bindings), FUNCS (the label and
// output accessors of the mode), COMMON and MATH (shared WGSL).
struct Params {
    rows: u32,
    cols: u32,
    g: u32,
    t: u32,
    groups_x: u32,
    // Element strides of the logits and the (dense) labels along rows and columns (0 on a
    // broadcast dimension).
    x_rs: u32,
    x_cs: u32,
    l_rs: u32,
    l_cs: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
$DECLS

const MODE: u32 = $MODEu;

var<workgroup> sh: array<f32, 256>;

$COMMON
$MATH

fn nan() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

// max(a, b), NaN if either is NaN, decided on the bits.
fn max_nan(a: f32, b: f32) -> f32 {
    if is_nan(a) {
        return a;
    }
    if is_nan(b) {
        return b;
    }
    return select(a, b, f32_less(a, b));
}

fn load_x(row: u32, j: u32) -> f32 {
    return x[row * p.x_rs + j * p.x_cs];
}

$FUNCS

// Combines the p.t values `v` of a group (slot = its invocation's index in the workgroup, base
// = the group's first slot) by max or sum; every invocation gets the result. Called by every
// invocation of the workgroup (it holds barriers).
fn group_reduce(slot: u32, base: u32, tid: u32, v: f32, is_max: bool) -> f32 {
    sh[slot] = v;
    workgroupBarrier();
    var s = p.t / 2u;
    loop {
        if s == 0u {
            break;
        }
        if tid < s {
            if is_max {
                sh[slot] = max_nan(sh[slot], sh[slot + s]);
            } else {
                sh[slot] = sh[slot] + sh[slot + s];
            }
        }
        workgroupBarrier();
        s = s / 2u;
    }
    let r = sh[base];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let tid = l % p.t;
    let gi = l / p.t;
    let row = (wid.y * p.groups_x + wid.x) * p.g + gi;
    let valid = row < p.rows;
    let base = gi * p.t;
    var m = bitcast<f32>(0xff800000u);
    if valid {
        for (var j = tid; j < p.cols; j = j + p.t) {
            m = max_nan(m, load_x(row, j));
        }
    }
    m = group_reduce(l, base, tid, m, true);
    var s = 0.0;
    if valid {
        for (var j = tid; j < p.cols; j = j + p.t) {
            s = s + exp_f32(load_x(row, j) - m);
        }
    }
    s = group_reduce(l, base, tid, s, false);
    let log_s = log_f32(s);
    if MODE == 3u {
        // loss = sum_j labels_j * (log(sum) - (x_j - max)).
        var acc = 0.0;
        if valid {
            for (var j = tid; j < p.cols; j = j + p.t) {
                acc = acc + label_value(row, j) * (log_s - (load_x(row, j) - m));
            }
        }
        acc = group_reduce(l, base, tid, acc, false);
        if valid && tid == 0u {
            write_loss(row, acc);
        }
    }
    if !valid {
        return;
    }
    if MODE == 2u {
        // An out-of-range label makes the row's loss and gradient NaN (TensorFlow's GPU
        // kernel; its CPU kernel reports an error).
        let lab = label_index(row);
        if tid == 0u {
            if lab < 0 {
                write_loss(row, nan());
            } else {
                write_loss(row, log_s - (load_x(row, u32(lab)) - m));
            }
        }
        for (var j = tid; j < p.cols; j = j + p.t) {
            var v = nan();
            if lab >= 0 {
                v = exp_f32(load_x(row, j) - m) / s - select(0.0, 1.0, u32(lab) == j);
            }
            write_out(row * p.cols + j, v);
        }
        return;
    }
    for (var j = tid; j < p.cols; j = j + p.t) {
        let d = load_x(row, j) - m;
        var v: f32;
        if MODE == 0u {
            v = exp_f32(d) / s;
        } else if MODE == 1u {
            v = d - log_s;
        } else {
            v = exp_f32(d) / s - label_value(row, j);
        }
        write_out(row * p.cols + j, v);
    }
}
