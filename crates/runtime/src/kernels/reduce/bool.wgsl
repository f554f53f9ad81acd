// Bool <-> int32 for All / Any: "widen" writes one 0/1 word per bool byte; "narrow" packs the
// words back into bytes (four per word; the last word's spare bytes are 0, outputs are padded).
struct Params {
    row: u32,
    n: u32,
    threads: u32,
    pad: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

const NARROW: bool = $NARROW;

$LINEAR_INDEX

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = linear_index(gid);
    if i >= p.threads {
        return;
    }
    if NARROW {
        var v = 0u;
        for (var k = 0u; k < 4u; k = k + 1u) {
            let e = i * 4u + k;
            if e < p.n && src[e] != 0u {
                v = v | (1u << (8u * k));
            }
        }
        dst[i] = v;
    } else {
        dst[i] = select(0u, 1u, ((src[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu) != 0u);
    }
}
