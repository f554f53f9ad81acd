//! The whole recurrent suite (tests/rnn.rs) with `TFWGPU_RNN_STEP=fused`: every timestep of the
//! suite's small layers computes its products with R itself (opt-in), where by default a MatMul
//! and a plain step do. A binary of its own: the switch is read once per process, so it is set
//! before main (ELF `.init_array`).
#[path = "rnn.rs"]
mod rnn;

#[used]
#[unsafe(link_section = ".init_array")]
static SET_ENV: extern "C" fn() = set_env;

extern "C" fn set_env() {
    // SAFETY: runs before main, while the process has one thread.
    unsafe {
        std::env::set_var("TFWGPU_RNN_STEP", "fused");
    }
}
