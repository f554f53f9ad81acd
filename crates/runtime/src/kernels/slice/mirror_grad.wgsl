// MirrorPadGrad: each output element (a position of the unpadded tensor) sums the gradient
// elements that MirrorPad copied from it: itself plus, per dimension, up to one reflected
// copy in the leading and one in the trailing padding. Sums in f32 (f16 rounded once).
// $LOAD_F32(i) reads gradient element i as f32; $STORE_BITS(v) gives the output bits.
struct Params {
    row: u32,
    n: u32,
    words: u32,
    rank: u32,
    symmetric: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
    out_dims: array<vec4<u32>, 2>,
    before: array<vec4<u32>, 2>,
    after: array<vec4<u32>, 2>,
    in_strides: array<vec4<u32>, 2>,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read_write> x: array<u32>;

fn value(e: u32) -> vec2<u32> {
    var cand: array<array<u32, 3>, 5>;
    var cnt: array<u32, 5>;
    var rem = e;
    var total = 1u;
    for (var k = 0u; k < p.rank; k = k + 1u) {
        let d = p.rank - 1u - k;
        let i = d >> 2u;
        let j = d & 3u;
        let n = p.out_dims[i][j];
        let o = rem % n;
        rem = rem / n;
        let b = p.before[i][j];
        let a = p.after[i][j];
        var c = 1u;
        cand[d][0] = o + b;
        if p.symmetric == 0u {
            if o >= 1u && o <= b {
                cand[d][c] = b - o;
                c = c + 1u;
            }
            if o + 2u <= n && o + a + 1u >= n {
                cand[d][c] = b + 2u * (n - 1u) - o;
                c = c + 1u;
            }
        } else {
            if o < b {
                cand[d][c] = b - 1u - o;
                c = c + 1u;
            }
            if o + a >= n {
                cand[d][c] = b + 2u * n - 1u - o;
                c = c + 1u;
            }
        }
        cnt[d] = c;
        total = total * c;
    }
    var sum = 0.0;
    for (var t = 0u; t < total; t = t + 1u) {
        var r = t;
        var off = 0u;
        for (var d = 0u; d < p.rank; d = d + 1u) {
            let c = cnt[d];
            off = off + cand[d][r % c] * p.in_strides[d >> 2u][d & 3u];
            r = r / c;
        }
        sum = sum + $LOAD_F32(off);
    }
    return vec2<u32>($STORE_BITS(sum), 0u);
}
