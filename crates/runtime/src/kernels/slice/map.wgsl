// Index map: output element e (row-major over p.out_dims) reads input element
// base + sum_d x_d * in_strides[d], where for output coordinate c in dimension d
//   modes 0-2 (slice/pad):  x = begin + c * stride, and when x falls outside [0, in_dim):
//                           mode 0 -> the fill value, 1 -> reflected (REFLECT),
//                           2 -> reflected including the edge (SYMMETRIC);
//   mode 3 (inverse slice): x = (c - begin) / stride when that is an integer in
//                           [0, in_dim), else the fill value (StridedSliceGrad).
// `load_x` and the packing of elements into words come from mod.rs.
struct Params {
    row: u32,
    n: u32,
    words: u32,
    rank: u32,
    mode: u32,
    fill_lo: u32,
    fill_hi: u32,
    base: u32,
    out_dims: array<vec4<u32>, 2>,
    begin: array<vec4<u32>, 2>,
    stride: array<vec4<u32>, 2>,
    in_dims: array<vec4<u32>, 2>,
    in_strides: array<vec4<u32>, 2>,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read_write> x: array<u32>;

fn value(e: u32) -> vec2<u32> {
    let fill = vec2<u32>(p.fill_lo, p.fill_hi);
    var rem = e;
    var off = p.base;
    for (var k = 0u; k < p.rank; k = k + 1u) {
        let d = p.rank - 1u - k;
        let i = d >> 2u;
        let j = d & 3u;
        let od = p.out_dims[i][j];
        let c = i32(rem % od);
        rem = rem / od;
        let b = bitcast<i32>(p.begin[i][j]);
        let s = bitcast<i32>(p.stride[i][j]);
        let n = i32(p.in_dims[i][j]);
        var xi: i32;
        if p.mode == 3u {
            let t = c - b;
            if t % s != 0 {
                return fill;
            }
            xi = t / s;
            if xi < 0 || xi >= n {
                return fill;
            }
        } else {
            xi = b + c * s;
            if xi < 0 || xi >= n {
                if p.mode == 0u {
                    return fill;
                }
                if p.mode == 1u {
                    if xi < 0 {
                        xi = -xi;
                    }
                    if xi >= n {
                        xi = 2 * (n - 1) - xi;
                    }
                } else {
                    if xi < 0 {
                        xi = -xi - 1;
                    }
                    if xi >= n {
                        xi = 2 * n - 1 - xi;
                    }
                }
            }
        }
        off = off + u32(xi) * p.in_strides[i][j];
    }
    return load_x(off);
}
