// Shared by stats_vec4.wgsl and onepass.wgsl (placeholders filled there): the per-invocation
// fold of one channel quad's rows and the shared-memory combine of two invocations' states.
// They use the binding mean_in, `ldx(e)` / `ldy(e)` (x's / dy's quad e as vec4<f32>), GRAD, and
// the shared arrays sa, sb, sc.

struct Fold {
    a: f32,
    b: vec4<f32>,
    c: vec4<f32>,
};

// Folds slot k into slot i.
fn combine(i: u32, k: u32) {
    if GRAD {
        sb[i] = sb[i] + sb[k];
        sc[i] = sc[i] + sc[k];
        return;
    }
    let na = sa[i];
    let nb = sa[k];
    if nb == 0.0 {
        return;
    }
    if na == 0.0 {
        sa[i] = nb;
        sb[i] = sb[k];
        sc[i] = sc[k];
        return;
    }
    let n = na + nb;
    let d = sb[k] - sb[i];
    sb[i] = sb[i] + d * (nb / n);
    sc[i] = sc[i] + sc[k] + d * d * (na * (nb / n));
    sa[i] = n;
}

// The rows start + lane, start + lane + lanes, ... below end of channel quad q (of `quads`):
// forward (count, mean, M2) from per-invocation shifted sums about its first row (Welford
// state); gradient (0, sum dy, sum dy * (x - mean)). Four rows per loop iteration, all loads
// before any fold and no guard inside (full groups only), then the remaining rows one at a
// time; the sums run in row order.
fn fold_rows(q: u32, quads: u32, start: u32, end: u32, lane: u32, lanes: u32) -> Fold {
    var a = 0.0;
    var b = vec4<f32>(0.0);
    var c = vec4<f32>(0.0);
    var m = vec4<f32>(0.0);
    var k = vec4<f32>(0.0);
    if GRAD {
        let ch = 4u * q;
        m = vec4<f32>(mean_in[ch], mean_in[ch + 1u], mean_in[ch + 2u], mean_in[ch + 3u]);
    }
    var j = start + lane;
    if !GRAD && j < end {
        k = ldx(j * quads + q);
    }
    // Four rows per iteration, all loads before any fold and no guard inside (full
    // groups only), then the remaining rows one at a time; the sums run in row order.
    let step = lanes * quads;
    while j + 3u * lanes < end {
        let e0 = j * quads + q;
        let e1 = e0 + step;
        let e2 = e1 + step;
        let e3 = e2 + step;
        let x0 = ldx(e0);
        let x1 = ldx(e1);
        let x2 = ldx(e2);
        let x3 = ldx(e3);
        if GRAD {
            let d0 = ldy(e0);
            let d1 = ldy(e1);
            let d2 = ldy(e2);
            let d3 = ldy(e3);
            b = b + d0;
            c = c + d0 * (x0 - m);
            b = b + d1;
            c = c + d1 * (x1 - m);
            b = b + d2;
            c = c + d2 * (x2 - m);
            b = b + d3;
            c = c + d3 * (x3 - m);
        } else {
            let y0 = x0 - k;
            let y1 = x1 - k;
            let y2 = x2 - k;
            let y3 = x3 - k;
            b = b + y0;
            c = c + y0 * y0;
            b = b + y1;
            c = c + y1 * y1;
            b = b + y2;
            c = c + y2 * y2;
            b = b + y3;
            c = c + y3 * y3;
            a = a + 4.0;
        }
        j += 4u * lanes;
    }
    while j < end {
        let e0 = j * quads + q;
        let x0 = ldx(e0);
        if GRAD {
            let d0 = ldy(e0);
            b = b + d0;
            c = c + d0 * (x0 - m);
        } else {
            let y0 = x0 - k;
            b = b + y0;
            c = c + y0 * y0;
            a = a + 1.0;
        }
        j += lanes;
    }
    if !GRAD && a > 0.0 {
        // (count, mean, M2) of the invocation's rows; rounding may leave a tiny negative
        // M2 (NaN stays NaN).
        let mean_shift = b / a;
        let m2 = c - b * mean_shift;
        c = select(m2, vec4<f32>(0.0), m2 < vec4<f32>(0.0));
        b = k + mean_shift;
    }
    return Fold(a, b, c);
}

// Every invocation of the workgroup (it has barriers): folds the rows of quad q where `valid`
// (fold_rows) and combines the p.tc-strided lanes of each quad in shared memory, so that
// slot t of lane 0 holds its quad's state (sa: count, sb: mean or sum dy, sc: M2 or
// sum dy * (x - mean)).
fn fold_lanes(t: u32, q: u32, valid: bool, quads: u32, start: u32, end: u32, lane: u32,
              lanes: u32) {
    var f = Fold(0.0, vec4<f32>(0.0), vec4<f32>(0.0));
    if valid {
        f = fold_rows(q, quads, start, end, lane, lanes);
    }
    sa[t] = f.a;
    sb[t] = f.b;
    sc[t] = f.c;
    workgroupBarrier();
    for (var s = lanes / 2u; s > 0u; s = s / 2u) {
        if lane < s {
            combine(t, t + s * p.tc);
        }
        workgroupBarrier();
    }
}
