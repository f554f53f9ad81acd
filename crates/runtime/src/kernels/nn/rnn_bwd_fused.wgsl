// The backward step's entry that computes its product itself (small layers): workgroup (x, b)
// holds step t + 1's gate gradients of b (`dgr` at word p.hin, the other half of the buffer
// from the one this step writes) in workgroup memory, invocation j sums them times R[:, j]
// (`dhr` binds R, [gh, H]: neighbouring invocations read neighbouring words).
var<workgroup> g_row: array<f32, $ROW>;

@compute @workgroup_size($FWG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let b = wg.y;
    let j = wg.x * $FWGu + lid.x;
    if p.flag != 0u {
        for (var q = lid.x; q < p.gh; q += $FWGu) {
            g_row[q] = dgr[p.hin + b * p.gh + q];
        }
    }
    workgroupBarrier();
    if j >= p.h {
        return;
    }
    var rec = 0.0;
    if p.flag != 0u {
        for (var q = 0u; q < p.gh; q++) {
            rec = fma(g_row[q], dhr[q * p.h + j], rec);
        }
    }
    cell(b * p.h + j, b, j, rec);
}
