//! Pieces of WGSL shared by the kernel families, and packing of params.
//!
//! Binding convention: `@binding(0)` is the uniform params struct `p`; tensors follow at 1, 2...
//! Every storage binding is declared `read_write`, inputs too: tensors are sub-allocated from
//! shared heap buffers, so an input and an output are often ranges of one wgpu buffer, and wgpu
//! rejects a buffer bound both read-only and read-write in one dispatch.

/// Workgroup size of 1-D kernels.
pub const WG: u32 = 256;

/// Loop iterations one invocation may run in all, nested loops counted together: Mesa's
/// llvmpipe (lavapipe, the CPU adapter of CI) silently leaves a shader's loops after 65,535
/// iterations, so kernels whose invocations walk long ranges split them into dispatches (or
/// workgroups) of at most this many iterations each, with margin.
pub const LOOP_BUDGET: usize = 32_768;

/// The loop iterations llvmpipe runs per invocation before it leaves a shader's loops.
pub const LOOP_LIMIT: usize = 65_535;

/// Packs 32-bit params for a uniform buffer.
pub fn params(words: &[u32]) -> Vec<u8> {
    bytemuck::cast_slice(words).to_vec()
}

/// Shader fragment: the linear invocation index for a grid from `kernel::grid_1d`, with the
/// row length in `p.row`.
pub const LINEAR_INDEX: &str =
    "fn linear_index(gid: vec3<u32>) -> u32 { return gid.y * p.row + gid.x; }\n";

/// Shader fragment: `atomic_add_out(at, v)` adds float `v` to element `at` of the
/// `array<atomic<u32>>` named `out` by a compare-and-swap loop on the float's bits (WGSL has
/// no float atomics); the order of concurrent additions is the GPU's.
pub const ATOMIC_ADD_OUT: &str = "fn atomic_add_out(at: u32, v: f32) {
    var old = atomicLoad(&out[at]);
    loop {
        let r = atomicCompareExchangeWeak(&out[at], old, bitcast<u32>(bitcast<f32>(old) + v));
        if r.exchanged {
            break;
        }
        old = r.old_value;
    }
}
";
