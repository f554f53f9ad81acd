// pool_vec4.wgsl's W8 functions (float16, C % 8 == 0): one invocation per pair of channel
// quads, `q` the pair's index within its (n, y, x); `a`, `b` and `out` hold vec4<u32> (eight
// halves), `codes` vec2<u32> (the two quads' code words, the same layout as one word per
// quad, so the per-quad gather reads them too). Whole 3x3 windows and the 2 x 2 block gather
// load 16 bytes per element and fold each quad with pool_vec4.wgsl's own functions (max9,
// codes9, block_add), so the results are those of the quad kernels bit for bit; other windows
// run the per-quad functions twice.

fn max_pool8(n: u32, oy: u32, ox: u32, q: u32) -> vec4<u32> {
    let r = window(oy, ox);
    if r.y - r.x == 3u && r.w - r.z == 3u {
        let octs = p.c / 8u;
        let row = p.w * octs;
        let i0 = ((n * p.h + r.x) * p.w + r.z) * octs + q;
        let i1 = i0 + row;
        let i2 = i1 + row;
        let v0 = a[i0];
        let v1 = a[i0 + octs];
        let v2 = a[i0 + 2u * octs];
        let v3 = a[i1];
        let v4 = a[i1 + octs];
        let v5 = a[i1 + 2u * octs];
        let v6 = a[i2];
        let v7 = a[i2 + octs];
        let v8 = a[i2 + 2u * octs];
        let lo = max9(v0.xy, v1.xy, v2.xy, v3.xy, v4.xy, v5.xy, v6.xy, v7.xy, v8.xy);
        let hi = max9(v0.zw, v1.zw, v2.zw, v3.zw, v4.zw, v5.zw, v6.zw, v7.zw, v8.zw);
        return vec4<u32>(lo, hi);
    }
    return vec4<u32>(max_pool(n, oy, ox, 2u * q), max_pool(n, oy, ox, 2u * q + 1u));
}

fn argmax_codes8(n: u32, oy: u32, ox: u32, q: u32) -> vec2<u32> {
    let r = window(oy, ox);
    if r.y - r.x == 3u && r.w - r.z == 3u {
        let octs = p.c / 8u;
        let row = p.w * octs;
        let i0 = ((n * p.h + r.x) * p.w + r.z) * octs + q;
        let i1 = i0 + row;
        let i2 = i1 + row;
        let v0 = a[i0];
        let v1 = a[i0 + octs];
        let v2 = a[i0 + 2u * octs];
        let v3 = a[i1];
        let v4 = a[i1 + octs];
        let v5 = a[i1 + 2u * octs];
        let v6 = a[i2];
        let v7 = a[i2 + octs];
        let v8 = a[i2 + 2u * octs];
        let lo = codes9(v0.xy, v1.xy, v2.xy, v3.xy, v4.xy, v5.xy, v6.xy, v7.xy, v8.xy);
        let hi = codes9(v0.zw, v1.zw, v2.zw, v3.zw, v4.zw, v5.zw, v6.zw, v7.zw, v8.zw);
        return vec2<u32>(lo, hi);
    }
    return vec2<u32>(argmax_codes(n, oy, ox, 2u * q), argmax_codes(n, oy, ox, 2u * q + 1u));
}

// max_pool_grad_block for a pair of quads.
fn max_pool_grad_block8(n: u32, by: u32, bx: u32, q: u32) {
    let octs = p.c / 8u;
    let oy0 = i32(by) - 1;
    let ox0 = i32(bx) - 1;
    let o0 = block_out(n, oy0, ox0, q, octs);
    let o1 = block_out(n, oy0, ox0 + 1, q, octs);
    let o2 = block_out(n, oy0 + 1, ox0, q, octs);
    let o3 = block_out(n, oy0 + 1, ox0 + 1, q, octs);
    let none = vec2<u32>(0xffffffffu);
    let c0 = select(none, codes[o0.x], o0.y == 1u);
    let c1 = select(none, codes[o1.x], o1.y == 1u);
    let c2 = select(none, codes[o2.x], o2.y == 1u);
    let c3 = select(none, codes[o3.x], o3.y == 1u);
    let b0 = b[o0.x];
    let b1 = b[o1.x];
    let b2 = b[o2.x];
    let b3 = b[o3.x];
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
        var lo = vec4<f32>(0.0);
        lo = block_add(lo, c0.x, ld(b0.xy), y, x, oy0, ox0, top && left);
        lo = block_add(lo, c1.x, ld(b1.xy), y, x, oy0, ox0 + 1, top && right);
        lo = block_add(lo, c2.x, ld(b2.xy), y, x, oy0 + 1, ox0, bottom && left);
        lo = block_add(lo, c3.x, ld(b3.xy), y, x, oy0 + 1, ox0 + 1, bottom && right);
        var hi = vec4<f32>(0.0);
        hi = block_add(hi, c0.y, ld(b0.zw), y, x, oy0, ox0, top && left);
        hi = block_add(hi, c1.y, ld(b1.zw), y, x, oy0, ox0 + 1, top && right);
        hi = block_add(hi, c2.y, ld(b2.zw), y, x, oy0 + 1, ox0, bottom && left);
        hi = block_add(hi, c3.y, ld(b3.zw), y, x, oy0 + 1, ox0 + 1, bottom && right);
        out[((n * p.h + u32(y)) * p.w + u32(x)) * octs + q] = vec4<u32>(st(lo), st(hi));
    }
}
