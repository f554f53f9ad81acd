// MaxPool and MaxPoolGrad over NHWC float32 or float16 with C % 4 == 0, four neighbouring
// channels per invocation (one vec4 load per window element; float16: four halves in a
// vec2<u32>, widened exactly by `ld`, stored by `st`), lane by lane TensorFlow's rules as in
// pool.wgsl, so the results are bit-identical to pool.wgsl's:
// - MODE 0, MaxPool: per output, the maximum from the lowest finite value of T, taking an element
//   only when it is greater (NaN never taken);
// - MODE 5, the argmax codes: per output and lane, the position of TensorFlow's argmax (the
//   window's first element, replaced only by a strictly greater one; NaN neither replaces nor
//   is replaced) as (y - y0) * kw + (x - x0) in the in-bounds window starting at (y0, x0),
//   8 bits per lane, four lanes in a u32 (0xff for an empty window);
// - MODE 2, MaxPoolGrad from the codes: per input, the grads of the covering outputs whose
//   code names this input, summed in TensorFlow's order (outputs row by row; float16 rounds
//   after every addition, `rt`, as Eigen's half).
// - MODE 6, MODE 2 for strides 2 x 2 and windows up to 4 x 4, one invocation per 2 x 2 block of
//   inputs (see max_pool_grad_block).
// - MODE 7, MODE 6 for 3x3 windows, strides 2 x 2 and no top or left padding, every code
//   position a constant (see max_pool_grad_3x3s2; `TFWGPU_POOL_GATHER3S2=1`).
// MaxPoolGrad is MODE 5 then MODE 2 (or 6, or 7): each window's argmax is computed once (one
// invocation per output) instead of once per input it covers (up to four times with 3x3 / 2),
// and the gradient pass reads one code word per covering output.
//
// Comparisons run on integer keys of the stored bits (the float's bits made monotonic, -0
// mapped to +0, so IEEE's -0 == +0 holds, NaN below everything), decided independently of
// the driver's float compare; MaxPool and the codes never widen the elements (float16
// compares its halves' own 16-bit keys) and MaxPool stores the selected element's bits.
//
// Placeholders filled in by mod.rs: MODE, GRID3, FAST, LINEAR_INDEX, XT, LD (ld, st, rt), COMMON, KEYS
// (keyx, bitsx, from_bitsx for XT), LOWEST_BITS (the lowest finite value of T).
struct Params {
    row: u32,
    n: u32,
    words: u32,
    nchw: u32,
    batch: u32,
    h: u32,
    w: u32,
    c: u32,
    oh: u32,
    ow: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    pt: u32,
    pl: u32,
    // GRID3: the items of one (n, y) row, in quads (ow * c / 4 or w * c / 4), and f32
    // reciprocals of c / 4, sh and sw for `div_small`.
    rowq: u32,
    inv_q: f32,
    inv_sh: f32,
    inv_sw: f32,
};
@group(0) @binding(0) var<uniform> p: Params;
// The input (MaxPool, codes).
@group(0) @binding(1) var<storage, read_write> a: array<$XT>;
// MaxPoolGrad: grad (output shaped).
@group(0) @binding(2) var<storage, read_write> b: array<$XT>;
// The argmax codes: written by MODE 5, read by MODE 2.
@group(0) @binding(3) var<storage, read_write> codes: array<u32>;
// MaxPool's output, MaxPoolGrad's dx.
@group(0) @binding(4) var<storage, read_write> out: array<$XT>;

const MODE: u32 = $MODEu;
// A three-dimensional grid: x over one row's quads (x * c / 4 + qd), y over the rows, z over
// the batch, so an invocation finds its coordinates with one small division instead of six
// divisions of a linear index (MaxPoolGrad's gather was bound by that integer arithmetic).
const GRID3: bool = $GRID3;
// Whole 3x3 windows first try the built-in max on float32 lanes (float16: widened exactly by
// `ld`, with hardware conversions only), which is TensorFlow's answer whenever no element is
// NaN and the maximum is a normal number or an infinity: then equal values have equal bits,
// so the maximum's bits are those of the first maximal element (MaxPool: max with the lowest
// finite value, as TensorFlow starts from it; codes: the first element equal to it). A
// window with a NaN or a zero or subnormal maximum (-0 / +0 ties; a driver flushing
// subnormals) takes the integer keys below. The keys cost ~11 integer operations per lane and
// element, which made MaxPool and the codes ALU-bound.
const FAST: bool = $FAST;
// Channels per item.
const LANES: u32 = 4u;
// float16 storage: the gathers' sums round to half after every addition (`rt`).
const HALF: bool = $HALF;
// float16 MaxPool and the argmax codes on whole 3x3 windows in native half arithmetic
// (`enable f16`, bindings 5 and 6: the input and MaxPool's output seen as vec4<f16>), without
// widening (pool_f16n.wgsl; `TFWGPU_POOL_F16_NATIVE=0` widens).
const NATIVE: bool = $NATIVEB;

$LINEAR_INDEX
$COMMON
$LD
fn lda(i: u32) -> $XT {
    return a[i];
}
fn ldb(i: u32) -> $XT {
    return b[i];
}
fn ldc(i: u32) -> u32 {
    return codes[i];
}
fn stc(i: u32, v: u32) {
    codes[i] = v;
}
fn sto(i: u32, v: $XT) {
    out[i] = v;
}

// Order keys of the four lanes: x < y (IEEE, non-NaN) iff key(x) < key(y); -0 keys as +0;
// NaN keys as i32 min, below every number, so a NaN is never greater than anything.
fn key4(x: vec4<f32>) -> vec4<i32> {
    let u = bitcast<vec4<u32>>(x);
    let b = select(u, vec4<u32>(0u), u == vec4<u32>(0x80000000u));
    let k = bitcast<vec4<i32>>(b ^ ((b >> vec4<u32>(31u)) * vec4<u32>(0x7fffffffu)));
    let nan = (u & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
    return select(k, vec4<i32>(-2147483647 - 1), nan);
}

// The in-bounds window of output (oy, ox): rows [r.x, r.y), columns [r.z, r.w).
fn window(oy: u32, ox: u32) -> vec4<u32> {
    let ys = i32(oy * p.sh) - i32(p.pt);
    let xs = i32(ox * p.sw) - i32(p.pl);
    let ye = min(ys + i32(p.kh), i32(p.h));
    let xe = min(xs + i32(p.kw), i32(p.w));
    return vec4<u32>(u32(max(ys, 0)), u32(max(ye, 0)), u32(max(xs, 0)), u32(max(xe, 0)));
}

// floor(v / d) for v < 2^22 (GRID3 checks the sizes) from an f32 reciprocal inv of d: the
// product is within 0.5 of v / d, so one correction step either way makes it exact.
fn div_small(v: u32, d: u32, inv: f32) -> u32 {
    var q = u32(f32(v) * inv);
    q = select(q, q - 1u, q * d > v);
    q = select(q, q + 1u, (q + 1u) * d <= v);
    return q;
}

// The outputs whose window covers input row (or column) `v`: [lo, hi).
fn covering(v: u32, pad: u32, k: u32, s: u32, n_out: u32, inv_s: f32) -> vec2<u32> {
    let vp = v + pad;
    var lo = 0u;
    var hi = 0u;
    if GRID3 {
        if vp >= k {
            lo = div_small(vp - k, s, inv_s) + 1u;
        }
        hi = min(div_small(vp, s, inv_s) + 1u, n_out);
    } else {
        if vp >= k {
            lo = (vp - k) / s + 1u;
        }
        hi = min(vp / s + 1u, n_out);
    }
    return vec2<u32>(lo, hi);
}

$KEYS

fn nan4(w: vec4<f32>) -> vec4<bool> {
    return (bitcast<vec4<u32>>(w) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
}

// Whether the built-in maximum mx is TensorFlow's (see FAST): no NaN, mx normal or infinite.
fn fast_ok(mx: vec4<f32>, nan: vec4<bool>) -> bool {
    let e = bitcast<vec4<u32>>(mx) & vec4<u32>(0x7f800000u);
    return !any(nan) && all(e != vec4<u32>(0u));
}

// The built-in maximum of nine lanes-vectors, and whether any lane saw a NaN.
struct Fast9 {
    mx: vec4<f32>,
    nan: vec4<bool>,
};

fn fast9(w0: vec4<f32>, w1: vec4<f32>, w2: vec4<f32>, w3: vec4<f32>, w4: vec4<f32>,
         w5: vec4<f32>, w6: vec4<f32>, w7: vec4<f32>, w8: vec4<f32>) -> Fast9 {
    let mx = max(max(max(w0, w1), max(w2, w3)), max(max(w4, w5), max(w6, w7)));
    let nan = ((nan4(w0) | nan4(w1)) | (nan4(w2) | nan4(w3))) |
        ((nan4(w4) | nan4(w5)) | (nan4(w6) | nan4(w7))) | nan4(w8);
    return Fast9(max(mx, w8), nan);
}

// The running maximum (bits and key) per lane; v replaces where key(v) > key (MaxPool).
struct Max4 {
    b: vec4<u32>,
    k: vec4<i32>,
};

fn max4(s: Max4, v: $XT) -> Max4 {
    let kv = keyx(v);
    let r = kv > s.k;
    return Max4(select(s.b, bitsx(v), r), select(s.k, kv, r));
}

// The argmax scan per lane: key of the best and its code.
struct Arg4 {
    k: vec4<i32>,
    code: vec4<u32>,
};

fn arg4(s: Arg4, v: $XT, code: u32) -> Arg4 {
    let kv = keyx(v);
    let r = kv > s.k;
    return Arg4(select(s.k, kv, r), select(s.code, vec4<u32>(code), r));
}

// The first element of a window: its key, except that a NaN is never replaced (i32 max).
fn arg_first(v: $XT) -> Arg4 {
    // Only NaN has the key i32 min.
    let k = keyx(v);
    return Arg4(select(k, vec4<i32>(2147483647), k == vec4<i32>(-2147483647 - 1)), vec4<u32>(0u));
}

// MaxPool over a whole 3x3 window, its nine elements already loaded (row by row).
fn max9(v0: $XT, v1: $XT, v2: $XT, v3: $XT, v4: $XT, v5: $XT, v6: $XT, v7: $XT,
        v8: $XT) -> $XT {
    let lowest = from_bitsx(vec4<u32>($LOWEST_BITSu));
    if FAST {
        let f = fast9(ld(v0), ld(v1), ld(v2), ld(v3), ld(v4), ld(v5), ld(v6), ld(v7), ld(v8));
        let mx = max(f.mx, ld(lowest));
        if fast_ok(mx, f.nan) {
            return st(mx);
        }
    }
    var m = Max4(bitsx(lowest), keyx(lowest));
    m = max4(m, v0);
    m = max4(m, v1);
    m = max4(m, v2);
    m = max4(m, v3);
    m = max4(m, v4);
    m = max4(m, v5);
    m = max4(m, v6);
    m = max4(m, v7);
    m = max4(m, v8);
    return from_bitsx(m.b);
}

fn max_pool(n: u32, oy: u32, ox: u32, qd: u32) -> $XT {
    let quads = p.c / 4u;
    let r = window(oy, ox);
    if r.y - r.x == 3u && r.w - r.z == 3u {
        // A whole 3x3 window: the nine loads first, then folded row by row.
        let row = p.w * quads;
        let i0 = ((n * p.h + r.x) * p.w + r.z) * quads + qd;
        let i1 = i0 + row;
        let i2 = i1 + row;
        let v0 = lda(i0);
        let v1 = lda(i0 + quads);
        let v2 = lda(i0 + 2u * quads);
        let v3 = lda(i1);
        let v4 = lda(i1 + quads);
        let v5 = lda(i1 + 2u * quads);
        let v6 = lda(i2);
        let v7 = lda(i2 + quads);
        let v8 = lda(i2 + 2u * quads);
        return max9(v0, v1, v2, v3, v4, v5, v6, v7, v8);
    }
    let lowest = from_bitsx(vec4<u32>($LOWEST_BITSu));
    var m = Max4(bitsx(lowest), keyx(lowest));
    for (var y = r.x; y < r.y; y = y + 1u) {
        for (var x = r.z; x < r.w; x = x + 1u) {
            m = max4(m, lda(((n * p.h + y) * p.w + x) * quads + qd));
        }
    }
    return from_bitsx(m.b);
}

// Four 8-bit lane codes in one word, lane 0 in the low byte.
fn pack_codes(c: vec4<u32>) -> u32 {
    return c.x | (c.y << 8u) | (c.z << 16u) | (c.w << 24u);
}

// The argmax codes of a whole 3x3 window, its nine elements already loaded (row by row).
fn codes9(v0: $XT, v1: $XT, v2: $XT, v3: $XT, v4: $XT, v5: $XT, v6: $XT, v7: $XT,
          v8: $XT) -> u32 {
    let kw = p.kw;
    if FAST {
        let w0 = ld(v0);
        let w1 = ld(v1);
        let w2 = ld(v2);
        let w3 = ld(v3);
        let w4 = ld(v4);
        let w5 = ld(v5);
        let w6 = ld(v6);
        let w7 = ld(v7);
        let w8 = ld(v8);
        let f = fast9(w0, w1, w2, w3, w4, w5, w6, w7, w8);
        if fast_ok(f.mx, f.nan) {
            // The first element equal to the maximum (every lane has one).
            let mb = bitcast<vec4<u32>>(f.mx);
            var c = vec4<u32>(2u * kw + 2u);
            c = select(c, vec4<u32>(2u * kw + 1u), bitcast<vec4<u32>>(w7) == mb);
            c = select(c, vec4<u32>(2u * kw), bitcast<vec4<u32>>(w6) == mb);
            c = select(c, vec4<u32>(kw + 2u), bitcast<vec4<u32>>(w5) == mb);
            c = select(c, vec4<u32>(kw + 1u), bitcast<vec4<u32>>(w4) == mb);
            c = select(c, vec4<u32>(kw), bitcast<vec4<u32>>(w3) == mb);
            c = select(c, vec4<u32>(2u), bitcast<vec4<u32>>(w2) == mb);
            c = select(c, vec4<u32>(1u), bitcast<vec4<u32>>(w1) == mb);
            c = select(c, vec4<u32>(0u), bitcast<vec4<u32>>(w0) == mb);
            return pack_codes(c);
        }
    }
    var s = arg_first(v0);
    s = arg4(s, v1, 1u);
    s = arg4(s, v2, 2u);
    s = arg4(s, v3, kw);
    s = arg4(s, v4, kw + 1u);
    s = arg4(s, v5, kw + 2u);
    s = arg4(s, v6, 2u * kw);
    s = arg4(s, v7, 2u * kw + 1u);
    s = arg4(s, v8, 2u * kw + 2u);
    return pack_codes(s.code);
}

fn argmax_codes(n: u32, oy: u32, ox: u32, qd: u32) -> u32 {
    let quads = p.c / 4u;
    let r = window(oy, ox);
    if r.y <= r.x || r.w <= r.z {
        return 0xffffffffu;
    }
    if r.y - r.x == 3u && r.w - r.z == 3u {
        let row = p.w * quads;
        let i0 = ((n * p.h + r.x) * p.w + r.z) * quads + qd;
        let i1 = i0 + row;
        let i2 = i1 + row;
        let v0 = lda(i0);
        let v1 = lda(i0 + quads);
        let v2 = lda(i0 + 2u * quads);
        let v3 = lda(i1);
        let v4 = lda(i1 + quads);
        let v5 = lda(i1 + 2u * quads);
        let v6 = lda(i2);
        let v7 = lda(i2 + quads);
        let v8 = lda(i2 + 2u * quads);
        return codes9(v0, v1, v2, v3, v4, v5, v6, v7, v8);
    }
    var s = arg_first(lda(((n * p.h + r.x) * p.w + r.z) * quads + qd));
    for (var y = r.x; y < r.y; y = y + 1u) {
        for (var x = r.z; x < r.w; x = x + 1u) {
            if y != r.x || x != r.z {
                s = arg4(s, lda(((n * p.h + y) * p.w + x) * quads + qd), (y - r.x) * p.kw + (x - r.z));
            }
        }
    }
    return pack_codes(s.code);
}

fn max_pool_grad(n: u32, y: u32, x: u32, qd: u32) -> vec4<f32> {
    let quads = p.c / 4u;
    let rows = covering(y, p.pt, p.kh, p.sh, p.oh, p.inv_sh);
    let cols = covering(x, p.pl, p.kw, p.sw, p.ow, p.inv_sw);
    var acc = vec4<f32>(0.0);
    for (var oy = rows.x; oy < rows.y; oy = oy + 1u) {
        // The in-bounds window of (oy, ox) starts at row max(oy * sh - pt, 0) and column
        // max(ox * sw - pl, 0) (`window`): this input's place in it is its code.
        let dy = y - u32(max(i32(oy * p.sh) - i32(p.pt), 0));
        let orow = (n * p.oh + oy) * p.ow;
        for (var ox = cols.x; ox < cols.y; ox = ox + 1u) {
            let dx = x - u32(max(i32(ox * p.sw) - i32(p.pl), 0));
            let mine = dy * p.kw + dx;
            let o = (orow + ox) * quads + qd;
            // The lanes whose code byte is `mine` are the zero bytes of z; whether there is
            // one at all by the exact zero-byte test (most covering outputs have none).
            let z = ldc(o) ^ (mine * 0x01010101u);
            if ((z - 0x01010101u) & ~z & 0x80808080u) != 0u {
                let lanes = (vec4<u32>(z) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
                acc = add_rt(acc, ld(ldb(o)), lanes == vec4<u32>(0u));
            }
        }
    }
    return acc;
}

// +0 in every lane for the gathers' sums to start from, read from the params (p.nchw is 0 in
// this shader) so that no compiler sees a literal zero: TensorFlow's sums start from +0, and
// 0 + -0 is +0, but Vulkan lets a compiler drop the sign of zero in float arithmetic, and
// lavapipe folded `vec4(0.0) + g` into g (a -0 grad gave -0 where TensorFlow gives +0: tests
// max_pool_grad_negative_zero_grads, max_pool_grad_3x3s2_sums). A runtime zero cannot be
// folded away.
fn zero4() -> vec4<f32> {
    return vec4<f32>(f32(p.nchw));
}

// acc + g in the lanes h, rounded as T after the addition (`rt`: float16 as Eigen's half sum).
// The round trip runs after every addition, the first included: skipping it where it cannot
// change the sum measured slower on the H200 (a per-lane test, session 9; the first addition
// by window shape, session 11).
fn add_rt(acc: vec4<f32>, g: vec4<f32>, h: vec4<bool>) -> vec4<f32> {
    let s = acc + g;
    if !HALF {
        return select(acc, s, h);
    }
    return select(acc, rt(s), h);
}

// The lanes of `code` that name input position `mine` of their window (zero bytes of the
// xor, tested exactly).
fn hits(code: u32, mine: u32) -> vec4<bool> {
    let z = code ^ (mine * 0x01010101u);
    let lanes = (vec4<u32>(z) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
    return lanes == vec4<u32>(0u);
}

// Output (oy, ox) of a MODE 6 block: its linear index (0 when out of range) and whether it
// is in range (1 or 0).
// `per`: items per output (p.c / 4).
fn block_out(n: u32, oy: i32, ox: i32, qd: u32, per: u32) -> vec2<u32> {
    let valid = oy >= 0 && ox >= 0 && oy < i32(p.oh) && ox < i32(p.ow);
    let o = select(0u, ((n * p.oh + u32(oy)) * p.ow + u32(ox)) * per + qd, valid);
    return vec2<u32>(o, u32(valid));
}

// acc plus the grad g of output (oy, ox) (code word `code`) in the lanes whose argmax is
// input (y, x), where the output's window covers that input (`cover`).
fn block_add(acc: vec4<f32>, code: u32, g: vec4<f32>, y: i32, x: i32, oy: i32, ox: i32,
             cover: bool) -> vec4<f32> {
    if !cover {
        return acc;
    }
    let dy = u32(y - max(2 * oy - i32(p.pt), 0));
    let dx = u32(x - max(2 * ox - i32(p.pl), 0));
    return add_rt(acc, g, hits(code, dy * p.kw + dx));
}

// MODE 6, MaxPoolGrad's gather for strides 2 x 2 and windows of at most 4 x 4 (ResNet's 3x3 /
// 2): the inputs in padded positions [2 by, 2 by + 2) x [2 bx, 2 bx + 2) are covered only by
// the outputs (by - 1 .. by) x (bx - 1 .. bx), so one invocation loads those four outputs'
// code words and grads together (no loop with runtime bounds: every load in flight at once;
// an output out of range reads as the code 0xffffffff, which names nothing) and writes the
// block's (up to) four inputs; each input sums its covering outputs row by row, as MODE 2.
// Output row by - 1 + ky covers padded row 2 by + ry iff 2 (1 - ky) + ry < kh (columns alike).
fn max_pool_grad_block(n: u32, by: u32, bx: u32, qd: u32) {
    let quads = p.c / 4u;
    let oy0 = i32(by) - 1;
    let ox0 = i32(bx) - 1;
    let o0 = block_out(n, oy0, ox0, qd, quads);
    let o1 = block_out(n, oy0, ox0 + 1, qd, quads);
    let o2 = block_out(n, oy0 + 1, ox0, qd, quads);
    let o3 = block_out(n, oy0 + 1, ox0 + 1, qd, quads);
    let c0 = select(0xffffffffu, ldc(o0.x), o0.y == 1u);
    let c1 = select(0xffffffffu, ldc(o1.x), o1.y == 1u);
    let c2 = select(0xffffffffu, ldc(o2.x), o2.y == 1u);
    let c3 = select(0xffffffffu, ldc(o3.x), o3.y == 1u);
    let g0 = ld(ldb(o0.x));
    let g1 = ld(ldb(o1.x));
    let g2 = ld(ldb(o2.x));
    let g3 = ld(ldb(o3.x));
    for (var r = 0u; r < 4u; r = r + 1u) {
        let ry = r >> 1u;
        let rx = r & 1u;
        let y = i32(2u * by + ry) - i32(p.pt);
        let x = i32(2u * bx + rx) - i32(p.pl);
        if y < 0 || x < 0 || y >= i32(p.h) || x >= i32(p.w) {
            continue;
        }
        let top = 2u + ry < p.kh;
        let left = 2u + rx < p.kw;
        let bottom = ry < p.kh;
        let right = rx < p.kw;
        var acc = zero4();
        acc = block_add(acc, c0, g0, y, x, oy0, ox0, top && left);
        acc = block_add(acc, c1, g1, y, x, oy0, ox0 + 1, top && right);
        acc = block_add(acc, c2, g2, y, x, oy0 + 1, ox0, bottom && left);
        acc = block_add(acc, c3, g3, y, x, oy0 + 1, ox0 + 1, bottom && right);
        sto(((n * p.h + u32(y)) * p.w + u32(x)) * quads + qd, st(acc));
    }
}

// The four 8-bit lane codes of a code word, lane 0 from the low byte.
fn code_lanes(c: u32) -> vec4<u32> {
    return (vec4<u32>(c) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
}

// MODE 7: MODE 6 for 3x3 windows, strides 2 x 2 and pt = pl = 0 (SAME on even sizes, VALID,
// explicit padding only after), ResNet's MaxPool. The block (by, bx) is the inputs
// (2 by + ry, 2 bx + rx); the outputs covering them are o0 = (by - 1, bx - 1),
// o1 = (by - 1, bx), o2 = (by, bx - 1), o3 = (by, bx), and as no window starts clamped
// (pt = pl = 0) every input's position in each covering window is a constant:
//   top-left (ry, rx) = (0, 0): o0 at 8, o1 at 6, o2 at 2, o3 at 0
//   top-right (0, 1):           o1 at 7, o3 at 1
//   bottom-left (1, 0):         o2 at 5, o3 at 3
//   bottom-right (1, 1):        o3 at 4
// Straight-line code: no loop, no window-shape tests, no per-output index arithmetic. Each
// input sums its hits in TensorFlow's order (o0, o1, o2, o3), as MODE 6, with the same
// additions in float32 and the same roundings where they can change a value: the first term
// needs none (0 + g is g, or +0 for -0: a value of T already, which `rt` returns unchanged),
// and the last rounding is the store's (`st(rt(s))` is `st(s)`: rt(s) is a value of T, stored
// exactly). So only the top-left input rounds between additions (after its second and third
// terms): 2 round trips per block where MODE 6 makes 9 (float16: 48 conversions per
// invocation instead of 104). An output out of range reads as the code 0xffffffff, whose
// lanes (0xff) name no position; its grad is loaded from index 0 and never selected.
fn max_pool_grad_3x3s2(n: u32, by: u32, bx: u32, qd: u32) {
    let quads = p.c / 4u;
    let up = by >= 1u && by - 1u < p.oh;
    let down = by < p.oh;
    let left = bx >= 1u && bx - 1u < p.ow;
    let right = bx < p.ow;
    let v0 = up && left;
    let v1 = up && right;
    let v2 = down && left;
    let v3 = down && right;
    // o3's index and the others' from it (wrapped where out of range: then not used).
    let i3 = ((n * p.oh + by) * p.ow + bx) * quads + qd;
    let i2 = i3 - quads;
    let i1 = i3 - p.ow * quads;
    let i0 = i1 - quads;
    let j0 = select(0u, i0, v0);
    let j1 = select(0u, i1, v1);
    let j2 = select(0u, i2, v2);
    let j3 = select(0u, i3, v3);
    let l0 = code_lanes(select(0xffffffffu, ldc(j0), v0));
    let l1 = code_lanes(select(0xffffffffu, ldc(j1), v1));
    let l2 = code_lanes(select(0xffffffffu, ldc(j2), v2));
    let l3 = code_lanes(select(0xffffffffu, ldc(j3), v3));
    let g0 = ld(ldb(j0));
    let g1 = ld(ldb(j1));
    let g2 = ld(ldb(j2));
    let g3 = ld(ldb(j3));
    let z = zero4();
    // Top-left: four terms, rounded after the second and the third.
    var tl = select(z, z + g0, l0 == vec4<u32>(8u));
    tl = select(tl, rt(tl + g1), l1 == vec4<u32>(6u));
    tl = select(tl, rt(tl + g2), l2 == vec4<u32>(2u));
    tl = select(tl, tl + g3, l3 == vec4<u32>(0u));
    // Top-right and bottom-left: two terms, rounded by the store.
    var tr = select(z, z + g1, l1 == vec4<u32>(7u));
    tr = select(tr, tr + g3, l3 == vec4<u32>(1u));
    var bl = select(z, z + g2, l2 == vec4<u32>(5u));
    bl = select(bl, bl + g3, l3 == vec4<u32>(3u));
    // Bottom-right: one term.
    let br = select(z, z + g3, l3 == vec4<u32>(4u));
    // The block's top-left input is in range (by < ceil(h / 2), bx < ceil(w / 2)).
    let e = ((n * p.h + 2u * by) * p.w + 2u * bx) * quads + qd;
    let row = p.w * quads;
    let xr = 2u * bx + 1u < p.w;
    sto(e, st(tl));
    if xr {
        sto(e + quads, st(tr));
    }
    if 2u * by + 1u < p.h {
        sto(e + row, st(bl));
        if xr {
            sto(e + row + quads, st(br));
        }
    }
}

$NATIVE_FNS

@compute @workgroup_size($WGX)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    // Items per (n, y, x): channel quads.
    let quads = p.c / LANES;
    // The item's (n, row, column, quad) and its linear index e.
    var n: u32;
    var yy: u32;
    var xx: u32;
    var qd: u32;
    var e: u32;
    // Columns and rows of the items: outputs (MaxPool, codes) or inputs (the gather).
    var cols = p.ow;
    var rows = p.oh;
    if MODE == 2u {
        cols = p.w;
        rows = p.h;
    }
    if MODE == 6u || MODE == 7u {
        // Blocks of 2 x 2 padded input positions (GRID3 only).
        cols = (p.w + p.pl + 1u) / 2u;
        rows = (p.h + p.pt + 1u) / 2u;
    }
    if GRID3 {
        let xq = wid.x * $WGXu + lid;
        if xq >= p.rowq {
            return;
        }
        n = wid.z;
        yy = wid.y;
        xx = div_small(xq, quads, p.inv_q);
        qd = xq - xx * quads;
        e = (n * rows + yy) * p.rowq + xq;
    } else {
        e = linear_index(gid);
        if e >= p.words {
            return;
        }
        qd = e % quads;
        let t = e / quads;
        xx = t % cols;
        let t2 = t / cols;
        yy = t2 % rows;
        n = t2 / rows;
    }
    if MODE == 6u {
        max_pool_grad_block(n, yy, xx, qd);
    } else if MODE == 7u {
        max_pool_grad_3x3s2(n, yy, xx, qd);
    } else if MODE == 0u {
        if NATIVE && max_pool_native(n, yy, xx, qd, e) {
            return;
        }
        sto(e, max_pool(n, yy, xx, qd));
    } else if MODE == 5u {
        if NATIVE && argmax_codes_native(n, yy, xx, qd, e) {
            return;
        }
        stc(e, argmax_codes(n, yy, xx, qd));
    } else {
        sto(e, st(max_pool_grad(n, yy, xx, qd)));
    }
}
