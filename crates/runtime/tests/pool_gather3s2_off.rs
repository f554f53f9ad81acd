//! The whole pool suite (tests/pool.rs) with `TFWGPU_POOL_GATHER3S2=0`: MaxPoolGrad's gather
//! for 3x3 windows, strides 2 x 2 and no top or left padding (NHWC, C % 4 == 0) runs
//! pool_vec4.wgsl's general block gather (MODE 6) instead of the default straight-line MODE 7
//! (constant code positions, 2 float16 round trips per block); every other shape keeps its
//! kernel. The results must
//! stay bit for bit TensorFlow's (`max_pool_grad_3x3s2_sums` and the 3x3 / 2 configurations
//! of the other tests). A binary of its own: the switch is read once per process, so it is
//! set before main (ELF `.init_array`).
#[path = "pool.rs"]
mod pool;
// tests/refs (a module of pool.rs here) names `crate::common`.
use pool::common;

#[used]
#[unsafe(link_section = ".init_array")]
static SET_ENV: extern "C" fn() = set_env;

extern "C" fn set_env() {
    // SAFETY: runs before main, while the process has one thread.
    unsafe {
        std::env::set_var("TFWGPU_POOL_GATHER3S2", "0");
    }
}
