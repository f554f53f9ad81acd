// pool_vec4.wgsl's NATIVE functions (float16, whole 3x3 windows, four channels per
// invocation): MaxPool and the argmax codes compared in half arithmetic, no
// element widened to float32 and no NaN test. The shader starts with `enable f16;` (mod.rs),
// and sees the input at binding 5 and MaxPool's output at binding 6 as vec4<f16> (one quad
// each), the same bytes as bindings 1 and 4 (vec2<u32> per quad).
//
// TensorFlow's rules hold by IEEE comparison itself: MaxPool starts from the lowest finite
// half and takes an element only when it is greater (`w > m` is false for a NaN w, so a NaN
// is never taken; -0 and +0 compare equal, so the first of them stays, as TensorFlow's); the
// codes start from the window's first element and take only a strictly greater one (nothing is
// greater than a NaN first element, which is TensorFlow's rule that it is never replaced).
// A driver that flushes half subnormals in comparisons changes only comparisons between two
// values of magnitude below 2^-14; the result is then a zero or a subnormal, so a window whose
// result has a lane of magnitude below 2^-14 (zeros included) is redone on the integer keys
// (the caller's path): otherwise the result is exact on any driver.
@group(0) @binding(5) var<storage, read_write> ah: array<vec4<f16>>;
@group(0) @binding(6) var<storage, read_write> oh: array<vec4<f16>>;

// Whether a lane of v is a zero or a subnormal (NaN is not).
fn tiny_h(v: vec4<f16>) -> bool {
    return any(abs(v) < vec4<f16>(0.00006103515625h));
}

// MAXFORM (the default; `TFWGPU_POOL_F16_NATIVE=select` turns it off): MaxPool by the
// built-in max (one packed max per two lanes on NVIDIA) instead of compare-and-select. WGSL's max returns the other operand when one
// is a NaN, which is TensorFlow's "a NaN is never taken"; a driver returning NaN instead gives
// a NaN result, which is redone on the integer keys like a zero or subnormal one (f16conv's
// native self-test checks max on this driver: NaN against a number gives the number or NaN,
// equal values either one, otherwise the larger).
const MAXFORM: bool = $NATIVE_MAX;

// The first element index of output (n, oy, ox)'s window (quad `qd`) and its row stride, in
// quads; x = u32 max when the window is not a whole 3x3 one.
fn whole3(n: u32, oy: u32, ox: u32, qd: u32) -> vec2<u32> {
    let quads = p.c / 4u;
    let r = window(oy, ox);
    if r.y - r.x != 3u || r.w - r.z != 3u {
        return vec2<u32>(0xffffffffu, 0u);
    }
    return vec2<u32>(((n * p.h + r.x) * p.w + r.z) * quads + qd, p.w * quads);
}

// The nine elements of a whole 3x3 window, quad by quad, from its first index and row stride.
struct Win9 {
    w0: vec4<f16>,
    w1: vec4<f16>,
    w2: vec4<f16>,
    w3: vec4<f16>,
    w4: vec4<f16>,
    w5: vec4<f16>,
    w6: vec4<f16>,
    w7: vec4<f16>,
    w8: vec4<f16>,
};

fn load9(s: vec2<u32>, d: u32) -> Win9 {
    let quads = p.c / 4u;
    let i0 = s.x + d;
    let i1 = i0 + s.y;
    let i2 = i1 + s.y;
    return Win9(ah[i0], ah[i0 + quads], ah[i0 + 2u * quads], ah[i1], ah[i1 + quads],
                ah[i1 + 2u * quads], ah[i2], ah[i2 + quads], ah[i2 + 2u * quads]);
}

// MaxPool of a window (the lowest half when every element is NaN or -inf).
fn max9_h(v: Win9) -> vec4<f16> {
    var m = vec4<f16>(-65504.0h);
    if MAXFORM {
        m = max(max(max(m, v.w0), max(v.w1, v.w2)), max(max(v.w3, v.w4), max(v.w5, v.w6)));
        return max(m, max(v.w7, v.w8));
    }
    m = select(m, v.w0, v.w0 > m);
    m = select(m, v.w1, v.w1 > m);
    m = select(m, v.w2, v.w2 > m);
    m = select(m, v.w3, v.w3 > m);
    m = select(m, v.w4, v.w4 > m);
    m = select(m, v.w5, v.w5 > m);
    m = select(m, v.w6, v.w6 > m);
    m = select(m, v.w7, v.w7 > m);
    m = select(m, v.w8, v.w8 > m);
    return m;
}

// Whether max9_h's result needs the integer keys: a zero or subnormal lane, or (MAXFORM) a NaN.
fn redo_max(m: vec4<f16>) -> bool {
    if MAXFORM {
        return !all(abs(m) >= vec4<f16>(0.00006103515625h));
    }
    return tiny_h(m);
}

// The argmax codes of a window and its maximum (the best element), by compare-and-select
// from the first element.
struct Codes9 {
    code: u32,
    m: vec4<f16>,
};

fn codes9_h(v: Win9) -> Codes9 {
    let kw = p.kw;
    var m = v.w0;
    var c = vec4<u32>(0u);
    var g = v.w1 > m;
    m = select(m, v.w1, g);
    c = select(c, vec4<u32>(1u), g);
    g = v.w2 > m;
    m = select(m, v.w2, g);
    c = select(c, vec4<u32>(2u), g);
    g = v.w3 > m;
    m = select(m, v.w3, g);
    c = select(c, vec4<u32>(kw), g);
    g = v.w4 > m;
    m = select(m, v.w4, g);
    c = select(c, vec4<u32>(kw + 1u), g);
    g = v.w5 > m;
    m = select(m, v.w5, g);
    c = select(c, vec4<u32>(kw + 2u), g);
    g = v.w6 > m;
    m = select(m, v.w6, g);
    c = select(c, vec4<u32>(2u * kw), g);
    g = v.w7 > m;
    m = select(m, v.w7, g);
    c = select(c, vec4<u32>(2u * kw + 1u), g);
    g = v.w8 > m;
    m = select(m, v.w8, g);
    c = select(c, vec4<u32>(2u * kw + 2u), g);
    return Codes9(pack_codes(c), m);
}

// MaxPool of output item e at (n, oy, ox, qd): stores it and returns true, or false where the
// caller must compute it (not a whole 3x3 window, or a result lane to redo).
fn max_pool_native(n: u32, oy: u32, ox: u32, qd: u32, e: u32) -> bool {
    let s = whole3(n, oy, ox, qd);
    if s.x == 0xffffffffu {
        return false;
    }
    let m = max9_h(load9(s, 0u));
    if redo_max(m) {
        return false;
    }
    oh[e] = m;
    return true;
}

// The argmax codes of output item e: stores them and returns true, or false as above.
fn argmax_codes_native(n: u32, oy: u32, ox: u32, qd: u32, e: u32) -> bool {
    let s = whole3(n, oy, ox, qd);
    if s.x == 0xffffffffu {
        return false;
    }
    let r = codes9_h(load9(s, 0u));
    if tiny_h(r.m) {
        return false;
    }
    stc(e, r.code);
    return true;
}

