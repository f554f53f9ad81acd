// Integer bit ops with broadcasting. Placeholders (dollar-prefixed): TYPE (0 int32, 1 int64
// as (low, high) words, 2 uint8 four to a word), OP (0 and, 1 or, 2 xor, 3 left shift,
// 4 right shift), LINEAR_INDEX, WG. int32 and int64: one invocation per element; uint8: per output word.
struct Params {
    row: u32,
    n: u32,
    rank: u32,
    threads: u32,
    // Collapsed output shape and the element strides of a and b (0 on broadcast dims).
    shape: array<vec4<u32>, 2>,
    sa: array<vec4<u32>, 2>,
    sb: array<vec4<u32>, 2>,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<u32>;
@group(0) @binding(2) var<storage, read_write> b: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

$LINEAR_INDEX

const TYPE: u32 = $TYPEu;
const OP: u32 = $OPu;

fn offsets(e: u32) -> vec2<u32> {
    var rem = e;
    var ia = 0u;
    var ib = 0u;
    for (var d = p.rank; d > 0u; d = d - 1u) {
        let k = d - 1u;
        let dim = p.shape[k / 4u][k % 4u];
        let c = rem % dim;
        rem = rem / dim;
        ia = ia + c * p.sa[k / 4u][k % 4u];
        ib = ib + c * p.sb[k / 4u][k % 4u];
    }
    return vec2<u32>(ia, ib);
}

// 32-bit op; `bits` is the type's width (32 or 8), `signed` selects the arithmetic right
// shift. The shift amount y is clamped to [0, bits - 1] as TensorFlow does.
fn op32(x: u32, y: u32, bits: u32, signed: bool) -> u32 {
    switch OP {
        case 0u: {
            return x & y;
        }
        case 1u: {
            return x | y;
        }
        case 2u: {
            return x ^ y;
        }
        default: {
            var s = y;
            if signed && bitcast<i32>(y) < 0 {
                s = 0u;
            }
            s = min(s, bits - 1u);
            if OP == 3u {
                return x << s;
            }
            if signed {
                return bitcast<u32>(bitcast<i32>(x) >> s);
            }
            return x >> s;
        }
    }
}

// 64-bit op on (low, high) words; shifts clamp the signed amount to [0, 63].
fn op64(x: vec2<u32>, y: vec2<u32>) -> vec2<u32> {
    switch OP {
        case 0u: {
            return x & y;
        }
        case 1u: {
            return x | y;
        }
        case 2u: {
            return x ^ y;
        }
        default: {
            var s = 0u;
            if bitcast<i32>(y.y) >= 0 {
                s = select(y.x, 63u, y.y != 0u || y.x > 63u);
            }
            if s == 0u {
                return x;
            }
            let hi_s = bitcast<i32>(x.y);
            if OP == 3u {
                if s >= 32u {
                    return vec2<u32>(0u, x.x << (s - 32u));
                }
                return vec2<u32>(x.x << s, (x.y << s) | (x.x >> (32u - s)));
            }
            if s >= 32u {
                return vec2<u32>(bitcast<u32>(hi_s >> (s - 32u)), bitcast<u32>(hi_s >> 31u));
            }
            return vec2<u32>((x.x >> s) | (x.y << (32u - s)), bitcast<u32>(hi_s >> s));
        }
    }
}

fn byte_of(arr_word: u32, i: u32) -> u32 {
    return (arr_word >> ((i & 3u) * 8u)) & 0xffu;
}

@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = linear_index(gid);
    if t >= p.threads {
        return;
    }
    if TYPE == 0u {
        let o = offsets(t);
        out[t] = op32(a[o.x], b[o.y], 32u, true);
    } else if TYPE == 1u {
        let o = offsets(t);
        let r = op64(vec2<u32>(a[2u * o.x], a[2u * o.x + 1u]), vec2<u32>(b[2u * o.y], b[2u * o.y + 1u]));
        out[2u * t] = r.x;
        out[2u * t + 1u] = r.y;
    } else {
        var w = 0u;
        for (var k = 0u; k < 4u; k = k + 1u) {
            let e = 4u * t + k;
            if e < p.n {
                let o = offsets(e);
                let x = byte_of(a[o.x >> 2u], o.x);
                let y = byte_of(b[o.y >> 2u], o.y);
                w = w | ((op32(x, y, 8u, false) & 0xffu) << (8u * k));
            }
        }
        out[t] = w;
    }
}
