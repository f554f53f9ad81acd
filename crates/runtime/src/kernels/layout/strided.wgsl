// Strided copy: the layout family's one shader (see strided.rs).
//
// The source is a view of up to 8 dimensions (innermost first in the params): element q of the
// iteration space reads source element
//     in_base + sum_d (c_d % wrap_d) * stride_d        (wrap_d = 0: no wrap)
// where c are q's coordinates in the view's dims. Strides may be negative (two's complement;
// u32 arithmetic wraps, the final offset is in range). The destination is a region of the
// output: `rows` runs of `len` elements, run r starting at out_base + r * out_stride;
// element q goes to run q / len, position q % len.
//
// Variants (constants substituted before compilation, named by the pipeline key):
// - WORDS words per element (1: f32/i32, 2: i64): one invocation per element.
// - PACKED with EPW elements per word (2: f16, 4: bool/u8): one invocation per output word
//   (per run: `per_row` words, the first one holding the run's first element); the whole word
//   is stored when the run covers it, otherwise the run's bytes are merged in with atomicAnd /
//   atomicOr, so invocations that share a word (neighbouring runs) never race.

struct Params {
    row: u32,
    count: u32,
    rank: u32,
    in_base: u32,
    out_base: u32,
    rows: u32,
    len: u32,
    out_stride: u32,
    per_row: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    dims: array<vec4<u32>, 2>,
    strides: array<vec4<u32>, 2>,
    wraps: array<vec4<u32>, 2>,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<DST_ELEM>;

LINEAR_INDEX

fn source_index(q: u32) -> u32 {
    var rem = q;
    var off = p.in_base;
    for (var d = 0u; d < p.rank; d++) {
        let n = p.dims[d / 4u][d % 4u];
        var c = rem % n;
        rem = rem / n;
        let w = p.wraps[d / 4u][d % 4u];
        if w != 0u {
            c = c % w;
        }
        off += c * p.strides[d / 4u][d % 4u];
    }
    return off;
}

#ifdef WORDS
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let q = linear_index(gid);
    if q >= p.count {
        return;
    }
    let r = q / p.len;
    let o = p.out_base + r * p.out_stride + (q - r * p.len);
    let s = source_index(q);
    for (var k = 0u; k < WORDS; k++) {
        dst[o * WORDS + k] = src[s * WORDS + k];
    }
}
#endif

#ifdef PACKED
const BITS: u32 = 32u / EPW;
const EMASK: u32 = (1u << BITS) - 1u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let q = linear_index(gid);
    if q >= p.count {
        return;
    }
    let r = q / p.per_row;
    let start = p.out_base + r * p.out_stride;
    let end = start + p.len;
    let w = start / EPW + (q - r * p.per_row);
    var v = 0u;
    var mask = 0u;
    for (var e = 0u; e < EPW; e++) {
        let o = w * EPW + e;
        if o >= start && o < end {
            let s = source_index(r * p.len + (o - start));
            let x = (src[s / EPW] >> ((s % EPW) * BITS)) & EMASK;
            v |= x << (e * BITS);
            mask |= EMASK << (e * BITS);
        }
    }
    if mask == 0u {
        return;
    }
    if mask == 0xffffffffu {
        atomicStore(&dst[w], v);
    } else {
        atomicAnd(&dst[w], ~mask);
        atomicOr(&dst[w], v);
    }
}
#endif
