//! The whole recurrent suite (tests/rnn.rs) with `TFWGPU_RNN_STEP=matmul`: every timestep's
//! products with R through a MatMul and a plain step (the default for large layers), where the
//! suite's small layers otherwise take the fused step that computes its products itself. A
//! binary of its own: the switch is read once per process, so it is set before main (ELF
//! `.init_array`).
#[path = "rnn.rs"]
mod rnn;

#[used]
#[unsafe(link_section = ".init_array")]
static SET_ENV: extern "C" fn() = set_env;

extern "C" fn set_env() {
    // SAFETY: runs before main, while the process has one thread.
    unsafe {
        std::env::set_var("TFWGPU_RNN_STEP", "matmul");
    }
}
