// The forward step's entry that computes its products itself (small layers: one dispatch per
// timestep instead of a MatMul and a step): workgroup (x, b) holds h_{t-1}[b] in workgroup
// memory, invocation j sums h_{t-1}[b, k] R^T[k, g * H + j] over k (`hr` binds R^T, [H, gh]:
// neighbouring invocations read neighbouring words).
var<workgroup> h_row: array<f32, $ROW>;

@compute @workgroup_size($FWG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let b = wg.y;
    let j = wg.x * $FWGu + lid.x;
    for (var k = lid.x; k < p.h; k += $FWGu) {
        h_row[k] = hs[p.hin + b * p.h + k];
    }
    workgroupBarrier();
    if j >= p.h {
        return;
    }
    var rec: array<f32, 4>;
    for (var k = 0u; k < p.h; k++) {
        let hk = h_row[k];
        let at = k * p.gh + j;
        for (var g = 0u; g < NG; g++) {
            rec[g] = fma(hk, hr[at + g * p.h], rec[g]);
        }
    }
    cell(b * p.h + j, b, j, rec);
}
