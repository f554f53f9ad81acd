//! tfwgpu-shader-stats: what the Vulkan driver made of each matmul shader variant.
//!
//! ```text
//! tfwgpu-shader-stats [--filter SUBSTRING,..] [--ir FILE] [--dump DIR] [--wgsl-dir DIR]
//! ```
//!
//! Translates each variant's WGSL to SPIR-V with naga (the options wgpu's Vulkan backend uses
//! for trusted shaders: no bounds checks, no loop bounding), compiles it on the first Vulkan
//! device that has `VK_KHR_pipeline_executable_properties`, and prints the driver's pipeline
//! statistics (registers, spills, shared memory, as the driver names them). `--ir` writes the
//! driver's internal representations (where it gives any) to FILE. A tuning aid: wgpu itself
//! cannot ask for these. `--dump DIR` writes each variant's WGSL and SPIR-V there (no device
//! needed). `--wgsl-dir DIR` adds every `*.wgsl` file of DIR as a variant named after the file
//! (e.g. the occupancy probes of `tfwgpu-bench occupancy --dump DIR`; with `--filter`, matched
//! by that name).

use std::ffi::CStr;
use std::fmt::Write as _;
use std::process::ExitCode;

use ash::vk;
use tfwgpu_runtime::DType;
use tfwgpu_runtime::kernels::matmul::coop::{COOP_TILES, CoopSpec, Input};
use tfwgpu_runtime::kernels::matmul::{Layouts, SCALAR_TILES, VEC4_TILES};

/// The cooperative-matrix variants (names start with `coop_`): every tile for subgroups of
/// 32, float16 operands in the default layouts at the tile's widest loads, the MatMul, the
/// Conv2D forward and the Conv2DBackpropInput forms.
fn coop_variants() -> Vec<(String, String)> {
    let mut v = vec![];
    for &tile in COOP_TILES {
        let w = if tile.wide { 8 } else { 4 };
        for (conv, bwd_input, wgrad) in [
            (false, false, false),
            (true, false, false),
            (true, true, false),
            (true, false, true),
        ] {
            let spec = CoopSpec {
                tile,
                lanes: 32,
                a_kfast: !wgrad,
                b_nfast: !bwd_input,
                wa: w,
                wb: w,
                input: Input::F16,
                conv,
                bwd_input,
                wgrad,
                split: wgrad,
                out_f32: wgrad,
                strided: false,
                phase: false,
                sum_last: false,
                head_tail: false,
                stream_k: false,
                vout: conv,
                emulate: false,
            };
            if spec.is_valid() {
                v.push((format!("coop_{}", spec.specialization()), spec.wgsl()));
            }
        }
    }
    v
}

fn variants() -> Vec<(String, String)> {
    let mut v = vec![];
    for t in SCALAR_TILES {
        v.push((format!("scalar_{}", t.name), t.wgsl(DType::F32)));
    }
    for t in VEC4_TILES {
        for (a_kfast, b_nfast) in [(true, true), (false, false), (true, false), (false, true)] {
            let l = Layouts { a_kfast, b_nfast };
            v.push((t.specialization(l), t.wgsl(DType::F32, l)));
        }
    }
    v.extend(coop_variants());
    v
}

/// SPIR-V 1.6 for the cooperative-matrix variants (what wgpu uses on Vulkan 1.3 devices),
/// 1.3 for the others.
fn spirv(wgsl: &str, coop: bool) -> Result<Vec<u32>, String> {
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| e.emit_to_string(wgsl))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("{e:?}"))?;
    let mut opts = naga::back::spv::Options {
        lang_version: if coop { (1, 6) } else { (1, 3) },
        ..Default::default()
    };
    opts.flags = naga::back::spv::WriterFlags::empty();
    opts.bounds_check_policies = naga::proc::BoundsCheckPolicies::default();
    opts.force_loop_bounding = false;
    opts.fake_missing_bindings = true;
    let popts = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    naga::back::spv::write_vec(&module, &info, &opts, Some(&popts)).map_err(|e| e.to_string())
}

fn bytemuck_words(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn cstr(bytes: &[std::ffi::c_char]) -> String {
    unsafe { CStr::from_ptr(bytes.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tfwgpu-shader-stats: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |n: &str| {
        args.iter()
            .position(|a| a == n)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let filter = flag("--filter");
    let ir_path = flag("--ir");
    let dump = flag("--dump");
    let mut all = variants();
    if let Some(dir) = flag("--wgsl-dir") {
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| format!("{dir}: {e}"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "wgsl"))
            .collect();
        files.sort();
        for f in files {
            let src = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
            let name = f
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            all.push((name, src));
        }
    }
    let mut ir_text = String::new();
    let vk_err = |e: vk::Result| e.to_string();
    // Translate (and so validate) every variant first; this needs no device.
    let mut shaders = vec![];
    for (vname, wgsl) in all {
        if filter
            .as_ref()
            .is_none_or(|f| f.split(',').any(|f| vname.contains(f)))
        {
            let words =
                spirv(&wgsl, vname.starts_with("coop_")).map_err(|e| format!("{vname}: {e}"))?;
            if let Some(d) = &dump {
                let w = |ext: &str, bytes: &[u8]| {
                    let p = format!("{d}/{vname}.{ext}");
                    std::fs::write(&p, bytes).map_err(|e| format!("{p}: {e}"))
                };
                w("wgsl", wgsl.as_bytes())?;
                w("spv", bytemuck_words(&words).as_slice())?;
            }
            shaders.push((vname, words));
        }
    }
    println!("{} variants translated to SPIR-V", shaders.len());
    unsafe {
        let entry = ash::Entry::load().map_err(|e| e.to_string())?;
        let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
        let instance = entry
            .create_instance(
                &vk::InstanceCreateInfo::default().application_info(&app),
                None,
            )
            .map_err(vk_err)?;
        let name = ash::khr::pipeline_executable_properties::NAME;
        let mut chosen = None;
        for pd in instance.enumerate_physical_devices().map_err(vk_err)? {
            let props = instance.get_physical_device_properties(pd);
            let exts = instance
                .enumerate_device_extension_properties(pd)
                .map_err(vk_err)?;
            let has = exts
                .iter()
                .any(|e| cstr(&e.extension_name) == name.to_string_lossy());
            println!(
                "device {} (driver version {:#x}): pipeline executable properties {}",
                cstr(&props.device_name),
                props.driver_version,
                if has { "yes" } else { "no" }
            );
            if has && chosen.is_none() {
                chosen = Some(pd);
            }
        }
        let pd = chosen.ok_or("no device with VK_KHR_pipeline_executable_properties")?;
        let qf = instance
            .get_physical_device_queue_family_properties(pd)
            .iter()
            .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .ok_or("no compute queue")? as u32;
        let prio = [1.0f32];
        let qinfo = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(qf)
            .queue_priorities(&prio)];
        // Every feature the device has (float16 arithmetic and storage, 16-bit storage,
        // the memory model, subgroups...) and cooperative matrices where listed, so that the
        // cooperative-matrix variants compile as they do under wgpu.
        let coop_name = ash::khr::cooperative_matrix::NAME;
        let has_coop = instance
            .enumerate_device_extension_properties(pd)
            .map_err(vk_err)?
            .iter()
            .any(|e| cstr(&e.extension_name) == coop_name.to_string_lossy());
        let mut ext_names = vec![name.as_ptr()];
        if has_coop {
            ext_names.push(coop_name.as_ptr());
        }
        println!(
            "cooperative matrices: {}",
            if has_coop { "enabled" } else { "absent" }
        );
        let mut v11 = vk::PhysicalDeviceVulkan11Features::default();
        let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut v13 = vk::PhysicalDeviceVulkan13Features::default();
        let mut cm = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
        let mut f2 = vk::PhysicalDeviceFeatures2::default()
            .push_next(&mut v11)
            .push_next(&mut v12)
            .push_next(&mut v13);
        if has_coop {
            f2 = f2.push_next(&mut cm);
        }
        instance.get_physical_device_features2(pd, &mut f2);
        let mut pep = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
            .pipeline_executable_info(true);
        let device = instance
            .create_device(
                pd,
                &vk::DeviceCreateInfo::default()
                    .queue_create_infos(&qinfo)
                    .enabled_extension_names(&ext_names)
                    .push_next(&mut pep)
                    .push_next(&mut f2),
                None,
            )
            .map_err(vk_err)?;
        let pexp = ash::khr::pipeline_executable_properties::Device::new(&instance, &device);
        let bindings: Vec<_> = (0..4u32)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(if b == 0 {
                        vk::DescriptorType::UNIFORM_BUFFER
                    } else {
                        vk::DescriptorType::STORAGE_BUFFER
                    })
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let dsl = device
            .create_descriptor_set_layout(
                &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
                None,
            )
            .map_err(vk_err)?;
        let layouts = [dsl];
        let pl = device
            .create_pipeline_layout(
                &vk::PipelineLayoutCreateInfo::default().set_layouts(&layouts),
                None,
            )
            .map_err(vk_err)?;
        for (vname, words) in shaders {
            if vname.starts_with("coop_") && !has_coop {
                println!("{vname:<28} skipped: no cooperative matrices");
                continue;
            }
            let module = device
                .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)
                .map_err(vk_err)?;
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(module)
                .name(c"main");
            let info = vk::ComputePipelineCreateInfo::default()
                .stage(stage)
                .layout(pl)
                .flags(if ir_path.is_some() {
                    vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
                        | vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR
                } else {
                    vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
                });
            let t0 = std::time::Instant::now();
            let pipe = device
                .create_compute_pipelines(vk::PipelineCache::null(), &[info], None)
                .map_err(|(_, e)| format!("{vname}: {e}"))?[0];
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            let pinfo = vk::PipelineInfoKHR::default().pipeline(pipe);
            let execs = pexp
                .get_pipeline_executable_properties(&pinfo)
                .map_err(vk_err)?;
            let mut line = format!(
                "{vname:<28} spirv {:>6} words, compile {ms:>6.0} ms:",
                words.len()
            );
            for (i, _) in execs.iter().enumerate() {
                let einfo = vk::PipelineExecutableInfoKHR::default()
                    .pipeline(pipe)
                    .executable_index(i as u32);
                for s in pexp
                    .get_pipeline_executable_statistics(&einfo)
                    .map_err(vk_err)?
                {
                    let v = match s.format {
                        vk::PipelineExecutableStatisticFormatKHR::BOOL32 => s.value.b32.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                        _ => s.value.f64.to_string(),
                    };
                    let _ = write!(line, " {}={}", cstr(&s.name), v);
                }
                if ir_path.is_some() {
                    // Two calls: sizes first, then data.
                    let mut reps = pexp
                        .get_pipeline_executable_internal_representations(&einfo)
                        .map_err(vk_err)?;
                    let mut bufs: Vec<Vec<u8>> =
                        reps.iter().map(|r| vec![0u8; r.data_size]).collect();
                    for (r, b) in reps.iter_mut().zip(bufs.iter_mut()) {
                        r.p_data = b.as_mut_ptr().cast();
                    }
                    let mut count = reps.len() as u32;
                    let _ = (pexp
                        .fp()
                        .get_pipeline_executable_internal_representations_khr)(
                        device.handle(),
                        &einfo,
                        &mut count,
                        reps.as_mut_ptr(),
                    );
                    for (r, b) in reps.iter().zip(&bufs) {
                        let _ = writeln!(
                            ir_text,
                            "==== {vname} / {} ({}) ====",
                            cstr(&r.name),
                            cstr(&r.description)
                        );
                        ir_text.push_str(&String::from_utf8_lossy(b).replace('\0', ""));
                        ir_text.push('\n');
                    }
                }
            }
            println!("{line}");
            device.destroy_pipeline(pipe, None);
            device.destroy_shader_module(module, None);
        }
        device.destroy_pipeline_layout(pl, None);
        device.destroy_descriptor_set_layout(dsl, None);
        device.destroy_device(None);
        instance.destroy_instance(None);
    }
    if let Some(p) = ir_path {
        std::fs::write(&p, ir_text).map_err(|e| format!("{p}: {e}"))?;
        eprintln!("wrote {p}");
    }
    Ok(())
}
