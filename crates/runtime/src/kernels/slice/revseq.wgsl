// ReverseSequence: along the batch axis, the first lens[b] elements of the sequence axis in
// reverse order, the rest as they are. `load_inp`, `index_lens` and the packing come from
// mod.rs. A length past the sequence axis is taken as its size, a negative one as 0 (TensorFlow's
// GPU kernel leaves such lengths unchecked; its CPU kernel refuses them).
struct Params {
    row: u32,
    n: u32,
    words: u32,
    // The sequence axis' size, and the elements between two of its steps.
    seq: u32,
    seq_stride: u32,
    // The batch axis' size, and the elements between two of its entries.
    batch: u32,
    batch_stride: u32,
    pad: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read_write> inp: array<u32>;
@group(0) @binding(3) var<storage, read_write> lens: array<u32>;

fn value(e: u32) -> vec2<u32> {
    let s = (e / p.seq_stride) % p.seq;
    let b = (e / p.batch_stride) % p.batch;
    let l = index_lens(b);
    var len = p.seq;
    if (l.y & 0x80000000u) != 0u {
        len = 0u;
    } else if l.y == 0u {
        len = min(l.x, p.seq);
    }
    if s < len {
        // Element len - 1 - s of the same sequence.
        return load_inp(e - s * p.seq_stride + (len - 1u - s) * p.seq_stride);
    }
    return load_inp(e);
}
