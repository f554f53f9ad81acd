// Shared by winograd.wgsl and winograd_fwd.wgsl (conv/winograd.rs puts it where
// `$INPUT_TRANSFORM` stands): the input transform of one 2x2-output tile. Tile t (image, tile
// row, tile column) and channel vector cv: its 4x4 window X of src (zero outside the image),
// BT X B written to the 16 planes of dst at i. The two kernels' BT differ only in the sign of
// the last row; each kernel defines `last(a, b)` as that row's a - b or b - a.

fn x_at(base: u32, iy: i32, ix: i32, c: u32) -> vec4<f32> {
    if iy < 0 || ix < 0 || u32(iy) >= p.h || u32(ix) >= p.w {
        return vec4<f32>();
    }
    return src[(base + u32(iy) * p.w + u32(ix)) * p.cv + c];
}

fn input_transform(t: u32, cv: u32, i: u32, plane: u32) {
    let tx = t % p.tw;
    let t2 = t / p.tw;
    let ty = t2 % p.th;
    let nb = p.img0 + t2 / p.th;
    let base = nb * p.h * p.w;
    let y0 = i32(2u * ty) - i32(p.pt);
    let x0 = i32(2u * tx) - i32(p.pl);
    // 4x4 window, BT X B (unrolled: every value in a register).
    let x00 = x_at(base, y0 + 0, x0 + 0, cv);
    let x01 = x_at(base, y0 + 0, x0 + 1, cv);
    let x02 = x_at(base, y0 + 0, x0 + 2, cv);
    let x03 = x_at(base, y0 + 0, x0 + 3, cv);
    let x10 = x_at(base, y0 + 1, x0 + 0, cv);
    let x11 = x_at(base, y0 + 1, x0 + 1, cv);
    let x12 = x_at(base, y0 + 1, x0 + 2, cv);
    let x13 = x_at(base, y0 + 1, x0 + 3, cv);
    let x20 = x_at(base, y0 + 2, x0 + 0, cv);
    let x21 = x_at(base, y0 + 2, x0 + 1, cv);
    let x22 = x_at(base, y0 + 2, x0 + 2, cv);
    let x23 = x_at(base, y0 + 2, x0 + 3, cv);
    let x30 = x_at(base, y0 + 3, x0 + 0, cv);
    let x31 = x_at(base, y0 + 3, x0 + 1, cv);
    let x32 = x_at(base, y0 + 3, x0 + 2, cv);
    let x33 = x_at(base, y0 + 3, x0 + 3, cv);
    let y00 = x00 - x20;
    let y10 = x10 + x20;
    let y20 = x20 - x10;
    let y30 = last(x30, x10);
    let y01 = x01 - x21;
    let y11 = x11 + x21;
    let y21 = x21 - x11;
    let y31 = last(x31, x11);
    let y02 = x02 - x22;
    let y12 = x12 + x22;
    let y22 = x22 - x12;
    let y32 = last(x32, x12);
    let y03 = x03 - x23;
    let y13 = x13 + x23;
    let y23 = x23 - x13;
    let y33 = last(x33, x13);
    dst[0u * plane + i] = y00 - y02;
    dst[1u * plane + i] = y01 + y02;
    dst[2u * plane + i] = y02 - y01;
    dst[3u * plane + i] = last(y03, y01);
    dst[4u * plane + i] = y10 - y12;
    dst[5u * plane + i] = y11 + y12;
    dst[6u * plane + i] = y12 - y11;
    dst[7u * plane + i] = last(y13, y11);
    dst[8u * plane + i] = y20 - y22;
    dst[9u * plane + i] = y21 + y22;
    dst[10u * plane + i] = y22 - y21;
    dst[11u * plane + i] = last(y23, y21);
    dst[12u * plane + i] = y30 - y32;
    dst[13u * plane + i] = y31 + y32;
    dst[14u * plane + i] = y32 - y31;
    dst[15u * plane + i] = last(y33, y31);
}
