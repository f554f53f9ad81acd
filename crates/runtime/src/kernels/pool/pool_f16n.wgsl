// pool_vec4.wgsl's NATIVE functions (float16, four channels per invocation, whole 3x3
// windows): MaxPool and the argmax codes compared in half arithmetic, no element widened to
// float32 and no NaN test. The shader starts with `enable f16;` (mod.rs), and sees the input
// (MaxPool, codes) at binding 5 and MaxPool's output at binding 6 as vec4<f16>, the same bytes
// as the vec2<u32> bindings 1 and 4.
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

// The first element index of output (n, oy, ox)'s window and its row stride, in items;
// x = u32 max when the window is not a whole 3x3 one.
fn whole3(n: u32, oy: u32, ox: u32, qd: u32) -> vec2<u32> {
    let quads = p.c / 4u;
    let r = window(oy, ox);
    if r.y - r.x != 3u || r.w - r.z != 3u {
        return vec2<u32>(0xffffffffu, 0u);
    }
    return vec2<u32>(((n * p.h + r.x) * p.w + r.z) * quads + qd, p.w * quads);
}

// MaxPool of output item e at (n, oy, ox, qd): stores it and returns true, or false where the
// caller must compute it (not a whole 3x3 window, or a zero / subnormal result lane).
fn max_pool_native(n: u32, oy: u32, ox: u32, qd: u32, e: u32) -> bool {
    let s = whole3(n, oy, ox, qd);
    if s.x == 0xffffffffu {
        return false;
    }
    let quads = p.c / 4u;
    let i0 = s.x;
    let i1 = i0 + s.y;
    let i2 = i1 + s.y;
    let w0 = ah[i0];
    let w1 = ah[i0 + quads];
    let w2 = ah[i0 + 2u * quads];
    let w3 = ah[i1];
    let w4 = ah[i1 + quads];
    let w5 = ah[i1 + 2u * quads];
    let w6 = ah[i2];
    let w7 = ah[i2 + quads];
    let w8 = ah[i2 + 2u * quads];
    var m = vec4<f16>(-65504.0h);
    m = select(m, w0, w0 > m);
    m = select(m, w1, w1 > m);
    m = select(m, w2, w2 > m);
    m = select(m, w3, w3 > m);
    m = select(m, w4, w4 > m);
    m = select(m, w5, w5 > m);
    m = select(m, w6, w6 > m);
    m = select(m, w7, w7 > m);
    m = select(m, w8, w8 > m);
    if tiny_h(m) {
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
    let quads = p.c / 4u;
    let kw = p.kw;
    let i0 = s.x;
    let i1 = i0 + s.y;
    let i2 = i1 + s.y;
    let w0 = ah[i0];
    let w1 = ah[i0 + quads];
    let w2 = ah[i0 + 2u * quads];
    let w3 = ah[i1];
    let w4 = ah[i1 + quads];
    let w5 = ah[i1 + 2u * quads];
    let w6 = ah[i2];
    let w7 = ah[i2 + quads];
    let w8 = ah[i2 + 2u * quads];
    var m = w0;
    var c = vec4<u32>(0u);
    var g = w1 > m;
    m = select(m, w1, g);
    c = select(c, vec4<u32>(1u), g);
    g = w2 > m;
    m = select(m, w2, g);
    c = select(c, vec4<u32>(2u), g);
    g = w3 > m;
    m = select(m, w3, g);
    c = select(c, vec4<u32>(kw), g);
    g = w4 > m;
    m = select(m, w4, g);
    c = select(c, vec4<u32>(kw + 1u), g);
    g = w5 > m;
    m = select(m, w5, g);
    c = select(c, vec4<u32>(kw + 2u), g);
    g = w6 > m;
    m = select(m, w6, g);
    c = select(c, vec4<u32>(2u * kw), g);
    g = w7 > m;
    m = select(m, w7, g);
    c = select(c, vec4<u32>(2u * kw + 1u), g);
    g = w8 > m;
    m = select(m, w8, g);
    c = select(c, vec4<u32>(2u * kw + 2u), g);
    if tiny_h(m) {
        return false;
    }
    stc(e, pack_codes(c));
    return true;
}

// One input's sum in the block gather (MODE 6), in half arithmetic: acc + g in the lanes h.
// A half addition rounds the exact sum once; Eigen's half sum (float32 addition, then rounded
// to half) rounds twice, which gives the same result because float32 carries at least
// 2 x 11 + 2 significant bits (double rounding is innocuous then). Unlike the comparisons
// above this relies on the driver keeping half subnormals in additions (no flush to zero):
// mod.rs takes this path only where f16conv's native self-test (`f16_native`) passed.
fn add_h(acc: vec4<f16>, g: vec4<f16>, h: vec4<bool>) -> vec4<f16> {
    return select(acc, acc + g, h);
}

fn block_add_h(acc: vec4<f16>, code: u32, g: vec4<f16>, y: i32, x: i32, oy: i32, ox: i32,
               cover: bool) -> vec4<f16> {
    if !cover {
        return acc;
    }
    let dy = u32(y - max(2 * oy - i32(p.pt), 0));
    let dx = u32(x - max(2 * ox - i32(p.pl), 0));
    return add_h(acc, g, hits(code, dy * p.kw + dx));
}

// max_pool_grad_block in half arithmetic: the grads seen as vec4<f16> at binding 5, dx at
// binding 6; the same loads, order of additions and stores. Always returns true.
fn max_pool_grad_block_native(n: u32, by: u32, bx: u32, qd: u32) -> bool {
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
    let g0 = ah[o0.x];
    let g1 = ah[o1.x];
    let g2 = ah[o2.x];
    let g3 = ah[o3.x];
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
        var acc = vec4<f16>(0.0h);
        acc = block_add_h(acc, c0, g0, y, x, oy0, ox0, top && left);
        acc = block_add_h(acc, c1, g1, y, x, oy0, ox0 + 1, top && right);
        acc = block_add_h(acc, c2, g2, y, x, oy0 + 1, ox0, bottom && left);
        acc = block_add_h(acc, c3, g3, y, x, oy0 + 1, ox0 + 1, bottom && right);
        oh[((n * p.h + u32(y)) * p.w + u32(x)) * quads + qd] = acc;
    }
    return true;
}
