// Per-channel results of the forward ops (rows of `put(row, ch, v)`, see finalize.wgsl):
// training from the channel's (mean, M2) over p.rest elements, inference from the given
// statistics. Shared by finalize.wgsl and onepass.wgsl (which define `put` and the bindings
// scale, offset, mean_in, var_in).
fn results_train(ch: u32, mean: f32, m2: f32) {
    let eps = bitcast<f32>(p.eps);
    let rest_inv = bitcast<f32>(p.rest_inv);
    let variance = m2 * rest_inv;
    let k = inverseSqrt(variance + eps) * scale[ch];
    let f = bitcast<f32>(p.factor);
    let adjust = bitcast<f32>(p.adjust);
    if p.factor_is_one == 1u {
        put(0u, ch, mean);
        put(1u, ch, variance * adjust);
    } else {
        let keep = 1.0 - f;
        put(0u, ch, keep * mean_in[ch] + f * mean);
        put(1u, ch, keep * var_in[ch] + (f * adjust) * variance);
    }
    put(2u, ch, mean);
    put(3u, ch, variance);
    put(4u, ch, mean);
    put(5u, ch, k);
    put(6u, ch, offset[ch]);
}

fn results_infer(ch: u32) {
    let eps = bitcast<f32>(p.eps);
    let mean = mean_in[ch];
    let variance = var_in[ch];
    put(0u, ch, mean);
    put(1u, ch, variance);
    put(2u, ch, mean);
    put(3u, ch, variance);
    put(4u, ch, mean);
    put(5u, ch, inverseSqrt(variance + eps) * scale[ch]);
    put(6u, ch, offset[ch]);
}
