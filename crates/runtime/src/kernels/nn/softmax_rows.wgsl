// Softmax and LogSoftmax over the rows of a contiguous [rows, cols] float32 tensor, reading
// each row twice (once from memory, once more while it is still in cache) instead of three
// times:
//
// 1. each invocation folds its part of the row into an online (max m, sum s of exp(x - m))
//    state, V elements per load (V = vec4<f32> when cols is a multiple of 4, else f32), two
//    loads issued per iteration of the main loop before either is used;
// 2. a tree in shared memory gives the row maximum M; each invocation rescales its sum to M
//    (s * exp(m - M)) and a second tree gives S = sum exp(x - M);
// 3. out = exp(x - M) * (1 / S) (Softmax) or (x - M) - log(S) (LogSoftmax), V elements per
//    store.
//
// A workgroup of 256 invocations holds p.g groups of p.t invocations (p.t a power of two); each
// group computes one row; p.vcols = cols / V loads per row. Special values as in TensorFlow: a
// row holding NaN or +inf, or only -inf, is NaN throughout; a -inf logit gives probability 0
// and log probability -inf (exp_le0(-inf) = 0; a state whose maximum is still -inf keeps s = 0
// instead of adding exp(-inf - -inf) = NaN).
//
// Placeholders: V (the load type), VFUNCS (lanes_max, lanes_sum_exp and out_vec for V), LOG
// (LogSoftmax), COMMON and MATH (shared WGSL).
struct Params {
    rows: u32,
    vcols: u32,
    g: u32,
    t: u32,
    groups_x: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<$V>;
@group(0) @binding(2) var<storage, read_write> out: array<$V>;

const LOG: bool = $LOG;
const NEG_INF_BITS: u32 = 0xff800000u;

var<workgroup> sh: array<f32, 256>;

$COMMON
$MATH

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

$VFUNCS

// exp(d) for d <= 0 (every argument here is x - max <= 0), NaN for NaN, 0 below -104 and
// for -inf: exp_f32's Cody-Waite reduction with a degree-7 Taylor polynomial (|r| <= ln(2)/2,
// truncation < 5.2e-9 relative, below 0.1 ulp) instead of degree 10, and no overflow branch.
fn exp_le0(d: f32) -> f32 {
    if is_nan(d) {
        return d;
    }
    if d < -104.0 {
        return 0.0;
    }
    let k = round(d * LOG2E);
    let r = (d - k * LN2_HI) - k * LN2_LO;
    var q = 1.0 + r * (1.0 / 7.0);
    q = 1.0 + r * (1.0 / 6.0) * q;
    q = 1.0 + r * (1.0 / 5.0) * q;
    q = 1.0 + r * (1.0 / 4.0) * q;
    q = 1.0 + r * (1.0 / 3.0) * q;
    q = 1.0 + r * (1.0 / 2.0) * q;
    q = 1.0 + r * q;
    // 2^k (k in [-151, 0]) in two normal factors: subnormal results round once, as in exp_f32.
    let ki = i32(k);
    let k1 = ki >> 1u;
    return q * pow2i(k1) * pow2i(ki - k1);
}

// Folds the elements of v into the state (m, s, NaN seen). The maximum uses the built-in max
// (no NaN test per element): a NaN only sets the flag, and a flagged invocation reports a NaN
// maximum to the row (so the row is NaN throughout, whatever m and s became).
fn fold(st: vec3<f32>, v: $V) -> vec3<f32> {
    var flag = st.z;
    if lanes_nan(v) {
        flag = 1.0;
    }
    let mv = max(st.x, lanes_max(v));
    if bitcast<u32>(mv) == NEG_INF_BITS {
        // Only -inf so far: the sum stays 0.
        return vec3<f32>(st.x, st.y, flag);
    }
    var s = st.y;
    if mv > st.x {
        // A larger maximum: rescale what was summed (s = 0 while st.x was -inf).
        s = s * exp_le0(st.x - mv);
    }
    return vec3<f32>(mv, s + lanes_sum_exp(v, mv), flag);
}

fn out_value(v: f32, m: f32, inv_s: f32, log_s: f32) -> f32 {
    let d = v - m;
    if LOG {
        return d - log_s;
    }
    return exp_le0(d) * inv_s;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let tid = l % p.t;
    let gi = l / p.t;
    let row = (wid.y * p.groups_x + wid.x) * p.g + gi;
    let valid = row < p.rows;
    let base = row * p.vcols;
    let n = p.vcols;
    let t = p.t;
    var st = vec3<f32>(bitcast<f32>(NEG_INF_BITS), 0.0, 0.0);
    if valid {
        var j = tid;
        // Two loads per iteration, both issued before the first fold.
        while j + t < n {
            let a = x[base + j];
            let b = x[base + j + t];
            st = fold(fold(st, a), b);
            j += 2u * t;
        }
        if j < n {
            st = fold(st, x[base + j]);
        }
    }
    if st.z != 0.0 {
        st.x = bitcast<f32>(0x7fc00000u);
    }
    // Row maximum.
    let first = gi * t;
    sh[l] = st.x;
    workgroupBarrier();
    for (var s = t / 2u; s > 0u; s = s / 2u) {
        if tid < s {
            sh[l] = max_nan(sh[l], sh[l + s]);
        }
        workgroupBarrier();
    }
    let m = sh[first];
    workgroupBarrier();
    // Row sum, each invocation's sum rescaled to the row maximum first.
    var mine = 0.0;
    if bitcast<u32>(st.x) != NEG_INF_BITS {
        // exp(NaN) (a NaN or +inf in the row) makes the sum NaN, as it must.
        mine = st.y * exp_le0(st.x - m);
    }
    sh[l] = mine;
    workgroupBarrier();
    for (var s = t / 2u; s > 0u; s = s / 2u) {
        if tid < s {
            sh[l] = sh[l] + sh[l + s];
        }
        workgroupBarrier();
    }
    var total = sh[first];
    if bitcast<u32>(m) == NEG_INF_BITS {
        // Only -inf in the row: NaN throughout (TensorFlow).
        total = bitcast<f32>(0x7fc00000u);
    }
    if !valid {
        return;
    }
    let log_s = log_f32(total);
    // One reciprocal per row, a product per element (3 ulp instead of the quotient's 2.5).
    let inv = 1.0 / total;
    var j = tid;
    while j + t < n {
        let a = x[base + j];
        let b = x[base + j + t];
        out[base + j] = out_vec(a, m, inv, log_s);
        out[base + j + t] = out_vec(b, m, inv, log_s);
        j += 2u * t;
    }
    if j < n {
        out[base + j] = out_vec(x[base + j], m, inv, log_s);
    }
}
