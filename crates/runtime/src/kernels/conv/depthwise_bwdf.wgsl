// The filter gradient of a float32 NHWC depthwise convolution with multiplier 1, channels a
// multiple of 4 and filters of at most 3x3 (conv/depthwise.rs `record_bwd_filter_vec4`):
// df[r, s, c] = sum over positions (n, oy, ox) of x[n, oy*sh - pt + r, ox*sw - pl + s, c] *
// dy[n, oy, ox, c].
//
// A workgroup of 256 invocations covers p.cvb vectors of 4 channels (a power of two, <= 256)
// and p.rows = 256 / p.cvb position lanes, for the positions of its split
// [wid.y * p.chunk, ..), each lane a contiguous run of them. Each invocation walks its lane's
// positions (at stride 1 sliding a 3x3 window of x in registers) and keeps every tap's
// sums (9 vectors) in registers: dy is read once, x once per tap (neighbouring
// positions share their window taps in the cache); the position's decomposition is done
// once for all taps and 4 channels. The lanes are then summed by a tree in workgroup memory
// (the same order every run) and each tap's vector is written to the split's slice of `part`
// (f32, [split][r][s][c]), which the family's finalize pass sums.

struct Params {
    h: u32,
    w: u32,
    cv: u32,
    oh: u32,
    ow: u32,
    fr: u32,
    fs: u32,
    sh: u32,
    sw: u32,
    pt: u32,
    pl: u32,
    positions: u32,
    chunk: u32,
    cvb: u32,
    rows: u32,
    out_len4: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dy: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> part: array<vec4<f32>>;

var<workgroup> red: array<vec4<f32>, 256>;

fn x_at(base: u32, iy: i32, ix: i32, c: u32) -> vec4<f32> {
    if iy < 0 || ix < 0 || u32(iy) >= p.h || u32(ix) >= p.w {
        return vec4<f32>();
    }
    return x[((base + u32(iy)) * p.w + u32(ix)) * p.cv + c];
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) l: u32,
) {
    let cvl = l % p.cvb;
    let lane = l / p.cvb;
    let cv = wid.x * p.cvb + cvl;
    let ok = cv < p.cv && lane < p.rows;
    let begin = wid.y * p.chunk;
    let end = min(p.positions, begin + p.chunk);
GEN_DECL
    if ok {
        // This lane's positions: a contiguous run, so that along a row of output (stride 1)
        // the 3x3 window of x slides by one column: 3 new loads per position instead of 9.
        let len = (end - begin + p.rows - 1u) / p.rows;
        let lb = begin + lane * len;
        let le = min(end, lb + len);
        var t = lb;
        var ox = t % p.ow;
        let t2 = t / p.ow;
        var oy = t2 % p.oh;
        var nb = t2 / p.oh;
        var fresh = true;
        loop {
            if t >= le {
                break;
            }
            let d = dy[t * p.cv + cv];
            let y0 = i32(oy * p.sh) - i32(p.pt);
            let x0 = i32(ox * p.sw) - i32(p.pl);
            let base = nb * p.h;
            if fresh || p.sw != 1u {
GEN_LOAD
            } else {
GEN_SHIFT
            }
GEN_FMA
            t += 1u;
            ox += 1u;
            fresh = false;
            if ox == p.ow {
                ox = 0u;
                oy += 1u;
                fresh = true;
                if oy == p.oh {
                    oy = 0u;
                    nb += 1u;
                }
            }
        }
    }
GEN_REDUCE
}
