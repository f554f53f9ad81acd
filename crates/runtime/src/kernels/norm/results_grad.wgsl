// Per-channel results of the gradient ops (rows of `put(row, ch, v)`, see finalize.wgsl)
// from the channel's sums of dy and dy * (x - mean) over p.rest elements (both 0 for the
// inference gradient, which uses rows 4 and 5 only). Shared by finalize.wgsl and
// onepass.wgsl (which define `put` and the bindings scale, mean_in, var_in).
fn results_grad(ch: u32, sum_dy: f32, sum_dyxc: f32) {
    let eps = bitcast<f32>(p.eps);
    let rest_inv = bitcast<f32>(p.rest_inv);
    let coef0 = inverseSqrt(var_in[ch] + eps);
    put(0u, ch, sum_dyxc * coef0);
    put(1u, ch, sum_dy);
    put(4u, ch, mean_in[ch]);
    put(5u, ch, scale[ch] * coef0);
    put(6u, ch, sum_dy * rest_inv);
    put(7u, ch, coef0 * coef0 * (sum_dyxc / f32(p.rest)));
}
