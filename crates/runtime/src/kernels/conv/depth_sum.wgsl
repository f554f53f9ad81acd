// Conv3D as sums of Conv2D over the depth taps (conv3d.rs): sums each output row's taps.
// `src` holds `taps` products of `pitch` elements each; a product's rows (`row` elements each)
// are indexed by (n, r) as n * rs + r. Output row (n, o), o < o_count, sums, over taps t, the
// source row picked by v = o * a + t * bt + cc (signed): when v is a multiple of dv and
// 0 <= v / dv < r_count, row r = v / dv (`src_o` == 0) or r = o (`src_o` == 1; v only decides
// whether the tap applies). Tap t of `src` is the op's tap t0 + t (taps summed in groups when
// all of them do not fit one binding); with `accumulate` the sum is added to the float32 output
// (a later group). Sums in float32, in tap order; float16 products (`SRC_HALF`) are read as
// packed halves; a float16 output (`OUT_HALF`) takes one word (two elements) per invocation.
struct Params {
    words: u32,
    row: u32,
    t0: u32,
    o_count: u32,
    row_len: u32,
    taps: u32,
    pitch: u32,
    a: i32,
    bt: i32,
    cc: i32,
    dv: i32,
    r_count: i32,
    rs: u32,
    src_o: u32,
    elements: u32,
    accumulate: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read_write> src: array<u32>;

$LINEAR_INDEX

fn load(i: u32) -> f32 {
    if SRC_HALF {
        let w = unpack2x16float(src[i >> 1u]);
        return select(w.x, w.y, (i & 1u) == 1u);
    }
    return bitcast<f32>(src[i]);
}

fn element(e: u32) -> f32 {
    let inner = e % p.row_len;
    let row = e / p.row_len;
    let o = i32(row % p.o_count);
    let n = row / p.o_count;
    var acc = 0.0;
    for (var t = 0u; t < p.taps; t = t + 1u) {
        let v = o * p.a + i32(p.t0 + t) * p.bt + p.cc;
        if v < 0 || v % p.dv != 0 {
            continue;
        }
        let r = v / p.dv;
        if r >= p.r_count {
            continue;
        }
        let rr = select(u32(r), u32(o), p.src_o == 1u);
        acc = acc + load(t * p.pitch + (n * p.rs + rr) * p.row_len + inner);
    }
    return acc;
}

@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = linear_index(gid);
    if i >= p.words {
        return;
    }
    if OUT_HALF {
        let e = 2u * i;
        var second = 0.0;
        if e + 1u < p.elements {
            second = element(e + 1u);
        }
        out[i] = pack2x16float(vec2<f32>(element(e), second));
    } else {
        var v = element(i);
        if p.accumulate == 1u {
            v = bitcast<f32>(out[i]) + v;
        }
        out[i] = bitcast<u32>(v);
    }
}
