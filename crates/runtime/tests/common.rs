//! Shared helpers for the runtime's integration tests: one device per test binary, seeded
//! random data, and comparison with tolerances.
#![allow(dead_code)]

use std::sync::OnceLock;

use rand::{Rng, SeedableRng, rngs::StdRng};
use tfwgpu_runtime::{Device, Element, Runtime, Tensor};

/// The test device (the best adapter; lavapipe in CI).
pub fn dev() -> &'static Device {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        let rt = Runtime::new().expect("tests need a GPU adapter (in CI: mesa-vulkan-drivers)");
        eprintln!("test adapter: {}", rt.device().description().name);
        rt
    })
    .device()
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub fn rand_f32(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

pub fn rand_i32(rng: &mut StdRng, n: usize, lo: i32, hi: i32) -> Vec<i32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// Asserts `got` matches `want` elementwise within `atol + rtol * |want|`; NaN must match NaN
/// and infinities must match exactly.
pub fn assert_close(got: &[f32], want: &[f32], rtol: f32, atol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}[{i}]: got {g}, want NaN");
        } else if w.is_infinite() {
            assert_eq!(g, w, "{what}[{i}]");
        } else {
            assert!(
                (g - w).abs() <= atol + rtol * w.abs(),
                "{what}[{i}]: got {g}, want {w} (rtol {rtol}, atol {atol})"
            );
        }
    }
}

/// Uploads each of `data` with its shape.
pub fn upload_all<T: Element>(data: &[Vec<T>], shapes: &[&[usize]]) -> Vec<Tensor> {
    data.iter()
        .zip(shapes)
        .map(|(d, s)| dev().upload(d, s).unwrap())
        .collect()
}

/// `wgsl` as SPIR-V (naga, as wgpu's Vulkan backend translates it): offline shader checks.
pub fn spirv(wgsl: &str) -> Result<Vec<u32>, String> {
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| e.emit_to_string(wgsl))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("{e:?}"))?;
    let opts = naga::back::spv::Options {
        lang_version: (1, 3),
        flags: naga::back::spv::WriterFlags::empty(),
        bounds_check_policies: naga::proc::BoundsCheckPolicies::default(),
        force_loop_bounding: false,
        ..Default::default()
    };
    let popts = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    naga::back::spv::write_vec(&module, &info, &opts, Some(&popts)).map_err(|e| e.to_string())
}

/// Tuning forced on with a fresh cache file in a temporary directory named after `tag` and the
/// process: (directory, cache file). Call before the first device use, in a test binary of
/// one test (the tuner reads its mode and file from the environment once per adapter).
pub fn tuning_with_fresh_cache(tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("tfwgpu-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tune.json");
    let _ = std::fs::remove_file(&path);
    // SAFETY: the caller's binary has one test, which calls this before any device use.
    unsafe {
        std::env::set_var("TFWGPU_TUNE", "1");
        std::env::set_var("TFWGPU_TUNE_CACHE", &path);
    }
    (dir, path)
}
