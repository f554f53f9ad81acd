// Depthwise forward pass and stride-1 input gradient, NHWC float32, channel multiplier 1,
// channels a multiple of 4 (depthwise.rs `record_vec4`): one invocation per 4 channels of an
// output pixel, 16-byte loads, the taps in the same order as depthwise.wgsl (same results).
// MODE 0: y[n, oy, ox, c] = sum_{r, s} x[n, oy*sh - pt + r, ox*sw - pl + s, c] f[r, s, c]
// MODE 1: dx[n, y, x, c] = sum_{r, s} dy[n, y + pt - r, x + pl - s, c] f[r, s, c] (stride 1)

struct Params {
    row: u32,
    total: u32,
    ih: u32,
    iw: u32,
    c4: u32,
    oh: u32,
    ow: u32,
    fr: u32,
    fs: u32,
    sh: u32,
    sw: u32,
    pt: u32,
    pl: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> filt: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;

const MODE: u32 = $MODE_IDu;

$LINEAR_INDEX

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = linear_index(gid);
    if i >= p.total {
        return;
    }
    let c = i % p.c4;
    let t = i / p.c4;
    var acc = vec4<f32>();
    if MODE == 2u {
        // The forward pass of filters up to 3x3: loops of constant trip counts (unrolled by
        // the compiler: constant filter offsets, no loop control), taps past the filter
        // skipped.
        let ox = t % p.ow;
        let t2 = t / p.ow;
        let oy = t2 % p.oh;
        let nb = t2 / p.oh;
        let y0 = i32(oy * p.sh) - i32(p.pt);
        let x0 = i32(ox * p.sw) - i32(p.pl);
        for (var r = 0u; r < 3u; r += 1u) {
            let iy = y0 + i32(r);
            if r >= p.fr || iy < 0 || u32(iy) >= p.ih {
                continue;
            }
            let rowb = (nb * p.ih + u32(iy)) * p.iw;
            for (var s = 0u; s < 3u; s += 1u) {
                let ix = x0 + i32(s);
                if s >= p.fs || ix < 0 || u32(ix) >= p.iw {
                    continue;
                }
                acc = fma(src[(rowb + u32(ix)) * p.c4 + c], filt[(r * p.fs + s) * p.c4 + c], acc);
            }
        }
        out[i] = acc;
        return;
    }
    if MODE == 0u {
        let ox = t % p.ow;
        let t2 = t / p.ow;
        let oy = t2 % p.oh;
        let nb = t2 / p.oh;
        let y0 = i32(oy * p.sh) - i32(p.pt);
        let x0 = i32(ox * p.sw) - i32(p.pl);
        for (var r = 0u; r < p.fr; r += 1u) {
            let iy = y0 + i32(r);
            if iy < 0 || u32(iy) >= p.ih {
                continue;
            }
            let rowb = (nb * p.ih + u32(iy)) * p.iw;
            for (var s = 0u; s < p.fs; s += 1u) {
                let ix = x0 + i32(s);
                if ix < 0 || u32(ix) >= p.iw {
                    continue;
                }
                acc = fma(src[(rowb + u32(ix)) * p.c4 + c], filt[(r * p.fs + s) * p.c4 + c], acc);
            }
        }
    } else {
        let x = t % p.iw;
        let t2 = t / p.iw;
        let y = t2 % p.ih;
        let nb = t2 / p.ih;
        let ty0 = i32(y + p.pt);
        let tx0 = i32(x + p.pl);
        for (var r = 0u; r < p.fr; r += 1u) {
            let oy = ty0 - i32(r);
            if oy < 0 {
                break;
            }
            if u32(oy) >= p.oh {
                continue;
            }
            let rowb = (nb * p.oh + u32(oy)) * p.ow;
            for (var s = 0u; s < p.fs; s += 1u) {
                let ox = tx0 - i32(s);
                if ox < 0 {
                    break;
                }
                if u32(ox) >= p.ow {
                    continue;
                }
                acc = fma(src[(rowb + u32(ox)) * p.c4 + c], filt[(r * p.fs + s) * p.c4 + c], acc);
            }
        }
    }
    out[i] = acc;
}
