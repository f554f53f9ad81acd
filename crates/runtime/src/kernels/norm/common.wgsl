// Params shared by the batch-norm shaders (norm_stats, norm_finalize, norm_apply). The tensor
// is viewed as (outer, c, inner) with the channel in the middle; `rest` = outer * inner
// elements per channel.
struct Params {
    row: u32,
    n: u32,
    words: u32,
    c: u32,
    inner: u32,
    rest: u32,
    chunk: u32,
    splits: u32,
    groups_x: u32,
    mode: u32,
    factor_is_one: u32,
    tc: u32,
    eps: u32,
    factor: u32,
    rest_inv: u32,
    adjust: u32,
    // stats_last.wgsl: chunks per arrival group.
    group: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
};
@group(0) @binding(0) var<uniform> p: Params;

// Flat index of element j (of `rest`) of channel ch.
fn elem_index(ch: u32, j: u32) -> u32 {
    if p.inner == 1u {
        // Channels innermost (NHWC): no division.
        return j * p.c + ch;
    }
    return ((j / p.inner) * p.c + ch) * p.inner + j % p.inner;
}
