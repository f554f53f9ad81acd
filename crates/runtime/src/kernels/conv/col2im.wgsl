// The input gradient from columns (conv/gemm.rs `bwd_input_col2im`): col[(n, oy, ox), (r, s, c)]
// (row length p.nc) holds dy[n, oy, ox, :] . f[r, s, c, :]; each dx element sums the taps
// whose strided window reaches it (NHWC, one group). One invocation per dx element of the
// images this dispatch covers; dx offsets start at p.out_base. With ELEM vec4<f32> (input
// depth a multiple of 4) an invocation takes 4 channels: p.c, p.nc, p.total and p.out_base
// then count vectors.

struct Params {
    row: u32,
    total: u32,
    h: u32,
    w: u32,
    c: u32,
    fr: u32,
    fs: u32,
    oh: u32,
    ow: u32,
    sh: u32,
    sw: u32,
    dh: u32,
    dw: u32,
    pt: u32,
    pl: u32,
    nc: u32,
    out_base: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> col: array<$ELEM>;
@group(0) @binding(2) var<storage, read_write> dx: array<$ELEM>;

$LINEAR_INDEX

@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = linear_index(gid);
    if i >= p.total {
        return;
    }
    let ch = i % p.c;
    let t = i / p.c;
    let x = t % p.w;
    let t2 = t / p.w;
    let y = t2 % p.h;
    let nb = t2 / p.h;
    var acc = $ELEM();
    for (var r = 0u; r < p.fr; r += 1u) {
        let ty = i32(y + p.pt) - i32(r * p.dh);
        if ty < 0 || u32(ty) % p.sh != 0u {
            continue;
        }
        let oy = u32(ty) / p.sh;
        if oy >= p.oh {
            continue;
        }
        for (var s = 0u; s < p.fs; s += 1u) {
            let tx = i32(x + p.pl) - i32(s * p.dw);
            if tx < 0 || u32(tx) % p.sw != 0u {
                continue;
            }
            let ox = u32(tx) / p.sw;
            if ox >= p.ow {
                continue;
            }
            acc += col[((nb * p.oh + oy) * p.ow + ox) * p.nc + (r * p.fs + s) * p.c + ch];
        }
    }
    dx[p.out_base + i] = acc;
}
