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
// Rows of at most K loads per invocation (CACHED: K = 4 in workgroups of 256 invocations, up
// to 4096 columns on vec4; K = 8 in workgroups of 1024 where the device allows, up to 32768
// columns) keep their loads in registers instead: pass 1 computes exp(x - m) once per element
// against the invocation's own maximum m, and pass 3 multiplies those by exp(m - M) / S, so
// each element costs one exp instead of two (and LogSoftmax none in pass 3), and the row is
// read from memory once. Without the registers, a long row is read again in pass 3, from L2
// only while it is still there: 2048 rows of 32768 floats in flight as 256-invocation
// workgroups (~1000 rows, 128 KiB each) are ~2.7 times the H200's 50 MB L2.
//
// SG (one row per workgroup, p.g == 1, on devices with subgroup operations): the two row
// reductions take a subgroup reduction, one shared-memory slot per subgroup and a second
// subgroup reduction by the first subgroup (two barriers each) instead of the trees' log2(t)
// barriers each; the order of the additions is the driver's, the NaN rules are unchanged (a
// maximum that drops a NaN still leaves a NaN sum, see fold).
//
// Placeholders: SG, SG_ARGS and SG_FNS (the subgroup built-ins and wg_max / wg_sum), V (the load
// type), VFUNCS (lanes_max, lanes_sum_exp, lanes_exp, lanes_sum, lanes_splat and out_vec for V),
// LOG (LogSoftmax), CACHED, WGS (the workgroup size), the CACHED code for its K loads (C_DECLS,
// C_LOADS, C_MAX, C_EXP, C_SUM, C_NAN, C_STORE), COMMON and MATH (shared WGSL).
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
// Rows of at most 4 loads per invocation: the loads stay in registers (c0..c3), their exps
// (e0..e3, relative to the invocation's own maximum) are computed once and rescaled for the
// output: one exp per element instead of two.
const CACHED: bool = $CACHED;
const SG: bool = $SG;
const WGS: u32 = $WGSu;
const NEG_INF_BITS: u32 = 0xff800000u;

var<workgroup> sh: array<f32, WGS>;
// SG: the workgroup's result of wg_max / wg_sum.
var<workgroup> sh_out: f32;

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

$SG_FNS

// exp(d) for d <= 0 (every argument here is x - max <= 0), NaN for NaN, 0 below -104 and
// for -inf: exp_f32's Cody-Waite reduction with a degree-7 Taylor polynomial (|r| <= ln(2)/2,
// truncation < 5.2e-9 relative, below 0.1 ulp) instead of degree 10, and no overflow branch.
// No branch at all: a NaN d makes r and q NaN, so the result is NaN whatever 2^k became
// (the integer conversion of a NaN k is some integer); -inf and d < -104 (whose exp rounds
// to 0) are selected to 0 at the end.
fn exp_le0(d: f32) -> f32 {
    let k = round(d * LOG2E);
    let r = (d - k * LN2_HI) - k * LN2_LO;
    // sum r^i / i! for i <= 7 by Horner on the coefficients: one multiply-add per degree
    // (fma) where the nested form 1 + r / i * q took two multiplies and an add.
    var q = fma(r, 1.0 / 5040.0, 1.0 / 720.0);
    q = fma(q, r, 1.0 / 120.0);
    q = fma(q, r, 1.0 / 24.0);
    q = fma(q, r, 1.0 / 6.0);
    q = fma(q, r, 0.5);
    q = fma(q, r, 1.0);
    q = fma(q, r, 1.0);
    // 2^k (k in [-151, 0]) in two normal factors: subnormal results round once, as in exp_f32.
    // k is clamped so that the factors stay normal for any d the select discards.
    let ki = clamp(i32(k), -252, 0);
    let k1 = ki >> 1u;
    return select(q * pow2i(k1) * pow2i(ki - k1), 0.0, d < -104.0);
}

// Folds the elements of v into the state (m, s). The maximum uses the built-in max (no NaN
// test per element; a driver may drop a NaN operand): a NaN element still makes its
// exp(x - m) NaN, so s becomes NaN and stays NaN (rescaling multiplies it, exps add to it),
// and a NaN s makes the row's sum, hence every output, NaN. Only while the maximum is still
// -inf (no exp is added) is the NaN test made.
fn fold(st: vec2<f32>, v: $V) -> vec2<f32> {
    let mv = max(st.x, lanes_max(v));
    if bitcast<u32>(mv) == NEG_INF_BITS {
        // Only -inf (or NaN) so far: the sum stays 0, or becomes NaN.
        if lanes_nan(v) {
            return vec2<f32>(st.x, bitcast<f32>(0x7fc00000u));
        }
        return st;
    }
    var s = st.y;
    if mv > st.x {
        // A larger maximum: rescale what was summed (s = 0 while st.x was -inf).
        s = s * exp_le0(st.x - mv);
    }
    return vec2<f32>(mv, s + lanes_sum_exp(v, mv));
}

// CACHED's output of a load: its exps times f (Softmax), or (x - M) - log S (LogSoftmax).
fn cached_out(c: $V, e: $V, m: f32, f: f32, log_s: f32) -> $V {
    if LOG {
        return (c - lanes_splat(m)) - lanes_splat(log_s);
    }
    return e * f;
}

fn out_value(v: f32, m: f32, inv_s: f32, log_s: f32) -> f32 {
    let d = v - m;
    if LOG {
        return d - log_s;
    }
    return exp_le0(d) * inv_s;
}

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32$SG_ARGS) {
    let tid = l % p.t;
    let gi = l / p.t;
    let row = (wid.y * p.groups_x + wid.x) * p.g + gi;
    let valid = row < p.rows;
    let base = row * p.vcols;
    let n = p.vcols;
    let t = p.t;
    var st = vec2<f32>(bitcast<f32>(NEG_INF_BITS), 0.0);
    let ninf = lanes_splat(bitcast<f32>(NEG_INF_BITS));
$C_DECLS
    if CACHED && valid {
        // Loads tid, tid + t, ..., tid + (K - 1) t of the row (n <= K t); missing ones stay
        // -inf.
        let j = base + tid;
$C_LOADS
        let mv = $C_MAX;
        if bitcast<u32>(mv) != NEG_INF_BITS {
$C_EXP
            // A NaN element has a NaN exp (see fold), so the sum is NaN.
            st = vec2<f32>(mv, $C_SUM);
        } else {
            // Only -inf here (or nothing, or NaN the maximum dropped): no sum, the exps stay
            // 0; a NaN makes the sum NaN.
            st = vec2<f32>(mv, 0.0);
            if $C_NAN {
                st.y = bitcast<f32>(0x7fc00000u);
            }
        }
    } else if valid {
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
    // Row maximum.
    let first = gi * t;
    var m: f32;
    if SG {
        m = wg_max(st.x$SG_PASS);
    } else {
        sh[l] = st.x;
        workgroupBarrier();
        for (var s = t / 2u; s > 0u; s = s / 2u) {
            if tid < s {
                sh[l] = max_nan(sh[l], sh[l + s]);
            }
            workgroupBarrier();
        }
        m = sh[first];
        workgroupBarrier();
    }
    // Row sum, each invocation's sum rescaled to the row maximum first.
    // exp(NaN) (a NaN or +inf in the row) makes the sum NaN, as it must; an invocation that
    // saw only -inf contributes its s (0, or NaN if it saw a NaN).
    var mine = st.y;
    if bitcast<u32>(st.x) != NEG_INF_BITS {
        mine = st.y * exp_le0(st.x - m);
    }
    var total: f32;
    if SG {
        total = wg_sum(mine$SG_PASS);
    } else {
        sh[l] = mine;
        workgroupBarrier();
        for (var s = t / 2u; s > 0u; s = s / 2u) {
            if tid < s {
                sh[l] = sh[l] + sh[l + s];
            }
            workgroupBarrier();
        }
        total = sh[first];
    }
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
    if CACHED {
        // Softmax: exp(x - mine) * (exp(mine - M) / S), the first factor from pass 1 (a NaN
        // or -inf-only row has a NaN total, so every output is NaN; an invocation of only
        // -inf has zero exps and a zero factor). LogSoftmax: (x - M) - log S.
        let f = exp_le0(st.x - m) * inv;
        let j = base + tid;
$C_STORE
        return;
    }
    // Pass 3 from the row's end back to its start: what pass 1 read last is the likeliest to
    // be still in L2 (rows longer than the registers hold are re-read).
    if tid >= n {
        return;
    }
    var r = i32((n - 1u - tid) / t);
    while r >= 1 {
        let ja = base + tid + u32(r) * t;
        let jb = ja - t;
        let a = x[ja];
        let b = x[jb];
        out[ja] = out_vec(a, m, inv, log_s);
        out[jb] = out_vec(b, m, inv, log_s);
        r -= 2;
    }
    if r == 0 {
        out[base + tid] = out_vec(x[base + tid], m, inv, log_s);
    }
}
