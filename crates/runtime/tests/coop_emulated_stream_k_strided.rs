//! Stream-K (`TFWGPU_CONV_COOP_STREAMK=1`, a wave of 7 workgroups) on v5b's strided input
//! gradients (`TFWGPU_CONV_COOP_PHASES=0`: the windows of dy at dx's positions; the default
//! per-phase products keep their plans), checked in the emulated form on any adapter with
//! float16 shaders against f64 references. A binary of its own: the settings are read once
//! per process.
mod common;
mod coop_cases;

use tfwgpu_runtime::kernels::matmul::coop::{COOP_64X64X64_2X2W1FS, COOP_64X64X64_4X2WG1FS};

fn setup() {
    coop_cases::setup_emulated(&[
        ("TFWGPU_CONV_COOP_PHASES", "0"),
        ("TFWGPU_CONV_COOP_WAVE", "7"),
        ("TFWGPU_CONV_COOP_STREAMK", "1"),
    ]);
}

#[test]
fn emulated_conv2d_backprop_input_strided_stream_k() {
    setup();
    let tiles = [COOP_64X64X64_2X2W1FS, COOP_64X64X64_4X2WG1FS];
    let labels = coop_cases::kernels_run(|| coop_cases::conv2d_backprop_input_strided(&tiles));
    if let Some(labels) = labels {
        // (Input channels 16 and 8 take the vector epilogue, so stream-K; 12 and 3 do not.)
        assert!(
            labels
                .iter()
                .any(|l| l.contains("convbis_") && l.contains("_stk")),
            "expected strided stream-K kernels among {labels:?}"
        );
    }
}
