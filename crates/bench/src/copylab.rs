//! `tfwgpu-bench ops --copy-lab`: where is the ceiling of a WGSL copy on this adapter?
//!
//! A self-contained experiment on its own wgpu device (not the runtime's), so that what the
//! runtime fixes (robust buffer access, heap buffers, usage flags, one binding per tensor) can be
//! varied one at a time. Every variant copies `size` bytes from one buffer to another, is
//! checked bit for bit once, then timed with pass timestamps around `d` back-to-back dispatches
//! (median of 5 passes; the span / d is one copy, as CUDA events around a batch measure it).
//!
//! Variables:
//! - element type (u32, vec2<u32>, vec4<u32>) and elements per invocation `k` (all loads
//!   issued before the stores, element `j` at `t + j * threads` so that a warp's accesses stay
//!   contiguous);
//! - workgroup size;
//! - a grid-stride ("persistent") loop over a fixed number of workgroups instead of one
//!   invocation per `k` elements;
//! - naga's bounds checks (`create_shader_module_trusted`) and the per-access `i < n` guards;
//! - the source declared `var<storage, read>` instead of `read_write`;
//! - buffer size, binding offset, source and destination in one buffer, usage flags;
//! - the device's robust buffer access (Vulkan `robustBufferAccess` and
//!   `robustBufferAccess2`, which wgpu turns on whenever the driver has them, and then leaves
//!   out naga's own buffer checks): device configs `default`, `rba1` (robustBufferAccess2 off,
//!   robustBufferAccess on) and `none` (both off: no bounds checks at all; the lab's shaders
//!   stay in range by construction).

use std::time::Instant;

use crate::cases::{Res, flag};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Robust {
    Default,
    Rba1,
    None,
}

impl Robust {
    fn name(self) -> &'static str {
        match self {
            Robust::Default => "default",
            Robust::Rba1 => "rba1",
            Robust::None => "none",
        }
    }
}

#[derive(Clone, Debug)]
struct Variant {
    /// 1 (u32), 2 (vec2<u32>) or 4 (vec4<u32>) words per element.
    words: u32,
    /// Elements per invocation.
    k: u32,
    wg: u32,
    /// Some(workgroups): a grid-stride loop over that many workgroups.
    persistent: Option<u32>,
    trusted: bool,
    /// Per-access `i < n` guards (off: the sizes divide exactly, only the early return stays).
    guard: bool,
    read_only: bool,
    mib: u64,
    /// Byte offset of both bindings inside their buffers.
    offset: u64,
    /// Source and destination bindings in one buffer (as in a runtime heap).
    same_buffer: bool,
    /// The source buffer created with STORAGE only (filled while mapped at creation) instead
    /// of STORAGE | COPY_SRC | COPY_DST as the runtime's heaps.
    storage_only: bool,
    /// vkCmdCopyBuffer (copy_buffer_to_buffer) instead of a shader.
    buffer_copy: bool,
}

impl Default for Variant {
    fn default() -> Self {
        Variant {
            words: 1,
            k: 1,
            wg: 256,
            persistent: None,
            trusted: false,
            guard: true,
            read_only: false,
            mib: 256,
            offset: 0,
            same_buffer: false,
            storage_only: false,
            buffer_copy: false,
        }
    }
}

impl Variant {
    fn name(&self) -> String {
        if self.buffer_copy {
            return format!("copy_buffer_{}MiB", self.mib);
        }
        let elem = match self.words {
            1 => "u32",
            2 => "vec2",
            _ => "vec4",
        };
        let mut s = format!("{elem}x{}_wg{}", self.k, self.wg);
        if let Some(g) = self.persistent {
            s += &format!("_p{g}");
        }
        if self.trusted {
            s += "_t";
        }
        if !self.guard {
            s += "_ng";
        }
        if self.read_only {
            s += "_ro";
        }
        s += &format!("_{}MiB", self.mib);
        if self.offset != 0 {
            s += &format!("_off{}", self.offset);
        }
        if self.same_buffer {
            s += "_same";
        }
        if self.storage_only {
            s += "_sto";
        }
        s
    }

    fn wgsl(&self) -> String {
        let elem = match self.words {
            1 => "u32",
            2 => "vec2<u32>",
            _ => "vec4<u32>",
        };
        let src_mode = if self.read_only { "read" } else { "read_write" };
        let wg = self.wg;
        let mut body = String::new();
        let ld = |j: u32, b: &mut String| {
            *b += &format!("        let i{j} = base + {j}u * p.threads;\n");
            if self.guard {
                *b += &format!(
                    "        var v{j}: {elem};\n        if i{j} < p.n {{ v{j} = src[i{j}]; }}\n"
                );
            } else {
                *b += &format!("        let v{j} = src[i{j}];\n");
            }
        };
        for j in 0..self.k {
            ld(j, &mut body);
        }
        for j in 0..self.k {
            if self.guard {
                body += &format!("        if i{j} < p.n {{ dst[i{j}] = v{j}; }}\n");
            } else {
                body += &format!("        dst[i{j}] = v{j};\n");
            }
        }
        let main = if self.persistent.is_some() {
            // p.threads = all invocations of the grid; one iteration moves k * threads elements.
            format!(
                "    for (var base = t; base < p.n; base += p.threads * {k}u) {{\n{body}    }}\n",
                k = self.k
            )
        } else {
            format!(
                "    if t >= p.threads {{ return; }}\n    let base = t;\n    {{\n{body}    }}\n"
            )
        };
        format!(
            "struct Params {{ n: u32, threads: u32, pad0: u32, pad1: u32 }};\n\
             @group(0) @binding(0) var<uniform> p: Params;\n\
             @group(0) @binding(1) var<storage, {src_mode}> src: array<{elem}>;\n\
             @group(0) @binding(2) var<storage, read_write> dst: array<{elem}>;\n\
             @compute @workgroup_size({wg})\n\
             fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,\n\
                     @builtin(local_invocation_index) l: u32) {{\n\
             \x20   let t = (w.y * nw.x + w.x) * {wg}u + l;\n{main}}}\n"
        )
    }
}

struct Lab {
    device: wgpu::Device,
    queue: wgpu::Queue,
    encoder_timestamps: bool,
}

/// Opens the first Vulkan adapter (a discrete GPU first) with TIMESTAMP_QUERY and the
/// adapter's own limits; `robust` picks the robust-buffer-access features of the device.
fn open(robust: Robust) -> Res<Lab> {
    let mut idesc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    idesc.backends = wgpu::Backends::VULKAN;
    idesc
        .flags
        .remove(wgpu::InstanceFlags::VALIDATION | wgpu::InstanceFlags::DEBUG);
    let instance = wgpu::Instance::new(idesc);
    let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN));
    adapters.sort_by_key(|a| a.get_info().device_type != wgpu::DeviceType::DiscreteGpu);
    let adapter = adapters.into_iter().next().ok_or("no Vulkan adapter")?;
    let mut features = wgpu::Features::TIMESTAMP_QUERY;
    let encoder_timestamps = adapter
        .features()
        .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS);
    if encoder_timestamps {
        features |= wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS;
    }
    if !adapter.features().contains(features) {
        return Err("the copy lab needs TIMESTAMP_QUERY".into());
    }
    let limits = adapter.limits();
    let desc = wgpu::DeviceDescriptor {
        label: Some("copy lab"),
        required_features: features,
        required_limits: limits.clone(),
        experimental_features: wgpu::ExperimentalFeatures::disabled(),
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    };
    let (device, queue) = if robust == Robust::Default {
        pollster::block_on(adapter.request_device(&desc)).map_err(|e| e.to_string())?
    } else {
        // SAFETY: the device is created by hand from wgpu-hal's own extension and feature
        // lists, with only the robust buffer access features cleared (wgpu then relies on
        // neither: on an adapter with robustBufferAccess2 it emits no bounds checks of its
        // own, so every shader of this lab must stay in range, which its indexing does).
        unsafe { open_without_robustness(&adapter, &desc, features, &limits, robust)? }
    };
    print_memory_types(&adapter);
    // A validation error fails the variant (its check or its timing), not the whole run.
    device.on_uncaptured_error(std::sync::Arc::new(|e| println!("   wgpu error: {e}")));
    Ok(Lab {
        device,
        queue,
        encoder_timestamps,
    })
}

unsafe fn open_without_robustness(
    adapter: &wgpu::Adapter,
    desc: &wgpu::DeviceDescriptor,
    features: wgpu::Features,
    limits: &wgpu::Limits,
    robust: Robust,
) -> Res<(wgpu::Device, wgpu::Queue)> {
    use ash::vk;
    let open = unsafe {
        let hal = adapter
            .as_hal::<wgpu::hal::api::Vulkan>()
            .ok_or("not a Vulkan adapter")?;
        let extensions = hal.required_device_extensions(features);
        let mut phd = hal.physical_device_features(&extensions, features);
        let family = vk::DeviceQueueCreateInfo::default()
            .queue_family_index(0)
            .queue_priorities(&[1.0]);
        let families = [family];
        let names: Vec<_> = extensions.iter().map(|s| s.as_ptr()).collect();
        let pre = vk::DeviceCreateInfo::default()
            .queue_create_infos(&families)
            .enabled_extension_names(&names);
        let mut info = phd.add_to_device_create(pre);
        // The core features: a copy with robustBufferAccess cleared (robustBufferAccess2 needs
        // it, so `rba1` keeps it and clears only the extension's feature).
        let mut core = *info.p_enabled_features;
        if robust == Robust::None {
            core.robust_buffer_access = 0;
        }
        info.p_enabled_features = &core;
        // Walk the pNext chain for VkPhysicalDeviceRobustness2FeaturesEXT.
        let mut next = info.p_next as *mut vk::BaseOutStructure;
        while !next.is_null() {
            if (*next).s_type == vk::StructureType::PHYSICAL_DEVICE_ROBUSTNESS_2_FEATURES_EXT {
                let r = next as *mut vk::PhysicalDeviceRobustness2FeaturesEXT;
                (*r).robust_buffer_access2 = 0;
            }
            next = (*next).p_next;
        }
        let instance = hal.shared_instance().raw_instance();
        let raw = instance
            .create_device(hal.raw_physical_device(), &info, None)
            .map_err(|e| format!("vkCreateDevice: {e}"))?;
        hal.device_from_raw(
            raw,
            None,
            &extensions,
            features,
            limits,
            &desc.memory_hints,
            0,
            0,
        )
        .map_err(|e| format!("device_from_raw: {e}"))?
    };
    unsafe { adapter.create_device_from_hal(open, desc) }.map_err(|e| e.to_string())
}

/// Prints the adapter's memory heaps and types (where a DEVICE_LOCAL buffer can live).
fn print_memory_types(adapter: &wgpu::Adapter) {
    // SAFETY: reads properties of the physical device only.
    unsafe {
        let Some(hal) = adapter.as_hal::<wgpu::hal::api::Vulkan>() else {
            return;
        };
        let instance = hal.shared_instance().raw_instance();
        let p = instance.get_physical_device_memory_properties(hal.raw_physical_device());
        for (i, h) in p.memory_heaps[..p.memory_heap_count as usize]
            .iter()
            .enumerate()
        {
            println!("  heap {i}: {} MiB {:?}", h.size >> 20, h.flags);
        }
        for (i, t) in p.memory_types[..p.memory_type_count as usize]
            .iter()
            .enumerate()
        {
            println!("  type {i}: heap {} {:?}", t.heap_index, t.property_flags);
        }
    }
}

fn buffer(lab: &Lab, size: u64) -> wgpu::Buffer {
    lab.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

/// The compute pipeline of `src`'s `main`, without naga's bounds checks where `trusted`.
///
/// # Safety
/// Where `trusted`, every access of the shader must be in bounds.
unsafe fn pipeline(lab: &Lab, src: String, trusted: bool) -> wgpu::ComputePipeline {
    // SAFETY: the caller's.
    unsafe { compute_pipeline(&lab.device, src, trusted) }
}

/// [`pipeline`] on any device (also `tfwgpu-bench occupancy` and `coopdirect`).
///
/// # Safety
/// Where `trusted`, every access of the shader must be in bounds.
pub(crate) unsafe fn compute_pipeline(
    device: &wgpu::Device,
    src: String,
    trusted: bool,
) -> wgpu::ComputePipeline {
    let desc = wgpu::ShaderModuleDescriptor {
        label: None,
        source: wgpu::ShaderSource::Wgsl(src.into()),
    };
    let module = if trusted {
        // SAFETY: the caller's.
        unsafe { device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
    } else {
        device.create_shader_module(desc)
    };
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    })
}

/// A bind group of group 0 of `pipe` with `buffers` whole at bindings 0, 1, ...
pub(crate) fn bind_buffers(
    device: &wgpu::Device,
    pipe: &wgpu::ComputePipeline,
    buffers: &[&wgpu::Buffer],
) -> wgpu::BindGroup {
    let entries: Vec<_> = buffers
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: b.as_entire_binding(),
        })
        .collect();
    device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipe.get_bind_group_layout(0),
        entries: &entries,
    })
}

/// A STORAGE-only buffer of `size` bytes whose `words` words from `off` hold the pattern.
fn source_storage_only(lab: &Lab, size: u64, off: u64, words: u64) -> Res<wgpu::Buffer> {
    let b = lab.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: true,
    });
    {
        let mut m = b
            .slice(off..off + words * 4)
            .get_mapped_range_mut()
            .map_err(|e| e.to_string())?;
        let data: Vec<u32> = (0..words).map(|i| pattern(i as u32)).collect();
        m.copy_from_slice(bytemuck::cast_slice(&data));
    }
    b.unmap();
    Ok(b)
}

fn wait(lab: &Lab) -> Res<()> {
    lab.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn read_buffer(lab: &Lab, buf: &wgpu::Buffer, offset: u64, size: u64) -> Res<Vec<u32>> {
    let staging = lab.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = lab.device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(buf, offset, &staging, 0, size);
    lab.queue.submit([enc.finish()]);
    staging.slice(..).map_async(wgpu::MapMode::Read, |_| ());
    wait(lab)?;
    let v = staging
        .slice(..)
        .get_mapped_range()
        .map_err(|e| e.to_string())?;
    Ok(bytemuck::cast_slice(&v).to_vec())
}

/// The pattern the source holds: word i = hash(i), never 0 (dst starts cleared).
fn pattern(i: u32) -> u32 {
    (i.wrapping_mul(2_654_435_761) ^ 0x5bd1_e995) | 1
}

/// What one timed command is: a dispatch (pipeline, bind group, grid) or a buffer copy.
enum Work<'a> {
    Dispatch(&'a wgpu::ComputePipeline, &'a wgpu::BindGroup, [u32; 3]),
    Copy(&'a wgpu::Buffer, u64, &'a wgpu::Buffer, u64, u64),
}

/// Pass (or encoder) timestamps around `d` back-to-back commands.
struct Timer {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
}

impl Timer {
    fn new(lab: &Lab) -> Timer {
        Timer {
            queries: lab.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: None,
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            }),
            resolve: lab.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: 16,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            readback: lab.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: 16,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        }
    }

    /// ns per command over one batch of `d`.
    fn time(&self, lab: &Lab, w: &Work, d: u32) -> Res<f64> {
        let mut enc = lab.device.create_command_encoder(&Default::default());
        match *w {
            Work::Dispatch(p, bg, groups) => {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                        query_set: &self.queries,
                        beginning_of_pass_write_index: Some(0),
                        end_of_pass_write_index: Some(1),
                    }),
                });
                pass.set_pipeline(p);
                pass.set_bind_group(0, bg, &[]);
                for _ in 0..d {
                    pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
                }
            }
            Work::Copy(src, so, dst, dof, bytes) => {
                enc.write_timestamp(&self.queries, 0);
                for _ in 0..d {
                    enc.copy_buffer_to_buffer(src, so, dst, dof, bytes);
                }
                enc.write_timestamp(&self.queries, 1);
            }
        }
        enc.resolve_query_set(&self.queries, 0..2, &self.resolve, 0);
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.readback, 0, 16);
        lab.queue.submit([enc.finish()]);
        self.readback
            .slice(..)
            .map_async(wgpu::MapMode::Read, |_| ());
        wait(lab)?;
        let ticks: Vec<u64> = {
            let m = self
                .readback
                .slice(..)
                .get_mapped_range()
                .map_err(|e| e.to_string())?;
            bytemuck::cast_slice(&m).to_vec()
        };
        self.readback.unmap();
        let period = lab.queue.get_timestamp_period() as f64;
        Ok(ticks[1].saturating_sub(ticks[0]) as f64 * period / d as f64)
    }

    /// Median ns per command over 5 batches of about 10 ms (after warm-up batches), and
    /// the batch length; `one`: the time of a single command.
    fn median(&self, lab: &Lab, w: &Work, one: f64) -> Res<(f64, u32)> {
        let d = ((10e6 / one.max(1.0)) as u32).clamp(3, 400);
        // Sustained load first: the SM clock needs it to come back up (see cases::WARM_MS).
        let warm = std::time::Duration::from_millis(
            crate::cases::WARM_MS.load(std::sync::atomic::Ordering::Relaxed),
        );
        let t0 = Instant::now();
        while t0.elapsed() < warm {
            self.time(lab, w, d)?;
        }
        let mut samples: Vec<f64> = (0..5).map(|_| self.time(lab, w, d)).collect::<Res<_>>()?;
        samples.sort_by(f64::total_cmp);
        Ok((samples[samples.len() / 2], d))
    }
}

struct Measured {
    name: String,
    robust: Robust,
    ms: f64,
    gbps: f64,
    dispatches: u32,
    ok: bool,
}

fn run_variant(lab: &Lab, v: &Variant, robust: Robust, mib_scale: u64) -> Res<Measured> {
    let bytes = (v.mib << 20) / mib_scale;
    let lim = lab.device.limits();
    if bytes > lim.max_storage_buffer_binding_size || 2 * (bytes + v.offset) > lim.max_buffer_size {
        return Err(format!(
            "{}: over the device's binding or buffer size limit",
            v.name()
        ));
    }
    let words = bytes / 4;
    let elems = words / v.words as u64;
    let off = v.offset;
    // Buffers: either one buffer holding src then dst, or two.
    let (src_buf, src_off, dst_buf, dst_off);
    let wpad = off + bytes;
    if v.same_buffer {
        let b = buffer(lab, 2 * wpad);
        src_buf = b.clone();
        dst_buf = b;
        src_off = off;
        dst_off = wpad + off;
    } else {
        src_buf = if v.storage_only {
            source_storage_only(lab, wpad, off, words)?
        } else {
            buffer(lab, wpad)
        };
        dst_buf = buffer(lab, wpad);
        src_off = off;
        dst_off = off;
    }
    if !v.storage_only {
        // Fill the source in 64 MiB chunks.
        let chunk = (16u64 << 20).min(words);
        let mut w = 0u64;
        while w < words {
            let n = chunk.min(words - w);
            let data: Vec<u32> = (w..w + n).map(|i| pattern(i as u32)).collect();
            lab.queue
                .write_buffer(&src_buf, src_off + w * 4, bytemuck::cast_slice(&data));
            w += n;
        }
    }
    let mut enc = lab.device.create_command_encoder(&Default::default());
    enc.clear_buffer(&dst_buf, dst_off, Some(bytes));
    lab.queue.submit([enc.finish()]);
    wait(lab)?;

    let threads_total: u64;
    let groups: [u32; 3];
    let pipeline = if v.buffer_copy {
        threads_total = 0;
        groups = [0; 3];
        None
    } else {
        // SAFETY (trusted): every index is below p.n (guarded) or the grid divides the size
        // exactly.
        let p = unsafe { pipeline(lab, v.wgsl(), v.trusted) };
        let wgs = match v.persistent {
            Some(g) => g as u64,
            None => elems.div_ceil(v.k as u64).div_ceil(v.wg as u64),
        };
        if !v.guard && v.persistent.is_none() && !elems.is_multiple_of(v.k as u64 * v.wg as u64) {
            return Err(format!("{}: size not a multiple of k * wg", v.name()));
        }
        threads_total = match v.persistent {
            Some(_) => wgs * v.wg as u64,
            None => elems / v.k as u64,
        };
        groups = if wgs <= 65535 {
            [wgs as u32, 1, 1]
        } else {
            let gy = wgs.div_ceil(65535);
            let gx = wgs.div_ceil(gy);
            [gx as u32, gy as u32, 1]
        };
        Some(p)
    };
    let params = lab.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let pw: [u32; 4] = [elems as u32, threads_total as u32, 0, 0];
    lab.queue
        .write_buffer(&params, 0, bytemuck::cast_slice(&pw));
    let bind = pipeline.as_ref().map(|p| {
        lab.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &p.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: params.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &src_buf,
                        offset: src_off,
                        size: wgpu::BufferSize::new(bytes),
                    }),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &dst_buf,
                        offset: dst_off,
                        size: wgpu::BufferSize::new(bytes),
                    }),
                },
            ],
        })
    });
    if v.buffer_copy && !lab.encoder_timestamps {
        return Err("copy_buffer: no timestamps inside encoders".into());
    }
    let what = match (&pipeline, &bind) {
        (Some(p), Some(bg)) => Work::Dispatch(p, bg, groups),
        _ => Work::Copy(&src_buf, src_off, &dst_buf, dst_off, bytes),
    };
    let timer = Timer::new(lab);
    let one = timer.time(lab, &what, 1)?;
    // Check once after the first copy.
    let got = read_buffer(lab, &dst_buf, dst_off, bytes)?;
    let ok = got.iter().enumerate().all(|(i, &w)| w == pattern(i as u32));
    drop(got);
    // About 10 ms per timed pass.
    let (ns, d) = timer.median(lab, &what, one)?;
    Ok(Measured {
        name: v.name(),
        robust,
        ms: ns / 1e6,
        gbps: 2.0 * bytes as f64 / ns,
        dispatches: d,
        ok,
    })
}

/// A streaming kernel with a loop: float32 sums of the rows of a [rows, cols] matrix, one
/// workgroup of 256 per row, `words` (1 or 4) floats per load, `unroll` independent loads per
/// iteration of a guard-free main loop (then a scalar tail), a shared-memory tree at the end.
/// `trusted`: naga's loop bounding and index checks off.
fn rowsum_wgsl(words: u32, unroll: u32) -> String {
    let (elem, hsum) = if words == 4 {
        ("vec4<f32>", "v.x + v.y + v.z + v.w")
    } else {
        ("f32", "v")
    };
    let mut main = String::new();
    for u in 0..unroll {
        main += &format!("            let v{u} = x[base + j + {}u];\n", u * 256);
    }
    for u in 0..unroll {
        main += &format!("            a{u} += hsum(v{u});\n");
    }
    let accs: String = (0..unroll)
        .map(|u| format!("    var a{u} = 0.0;\n"))
        .collect();
    let total: Vec<String> = (0..unroll).map(|u| format!("a{u}")).collect();
    format!(
        "struct Params {{ rows: u32, cols: u32, pad0: u32, pad1: u32 }};\n\
         @group(0) @binding(0) var<uniform> p: Params;\n\
         @group(0) @binding(1) var<storage, read_write> x: array<{elem}>;\n\
         @group(0) @binding(2) var<storage, read_write> y: array<f32>;\n\
         var<workgroup> sh: array<f32, 256>;\n\
         fn hsum(v: {elem}) -> f32 {{ return {hsum}; }}\n\
         @compute @workgroup_size(256)\n\
         fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,\n\
                 @builtin(local_invocation_index) l: u32) {{\n\
         \x20   let row = w.y * nw.x + w.x;\n\
         \x20   if row >= p.rows {{ return; }}\n\
         \x20   let base = row * p.cols;\n{accs}\
         \x20   var j = l;\n\
         \x20   loop {{\n\
         \x20       if j + {last}u >= p.cols {{ break; }}\n\
         \x20       {{\n{main}        }}\n\
         \x20       j += {step}u;\n\
         \x20   }}\n\
         \x20   for (; j < p.cols; j += 256u) {{ a0 += hsum(x[base + j]); }}\n\
         \x20   sh[l] = {total};\n\
         \x20   workgroupBarrier();\n\
         \x20   for (var s = 128u; s > 0u; s = s >> 1u) {{\n\
         \x20       if l < s {{ sh[l] += sh[l + s]; }}\n\
         \x20       workgroupBarrier();\n\
         \x20   }}\n\
         \x20   if l == 0u {{ y[row] = sh[0]; }}\n}}\n",
        last = (unroll - 1) * 256,
        step = unroll * 256,
        total = total.join(" + "),
    )
}

fn run_rowsum(
    lab: &Lab,
    (words, unroll, trusted): (u32, u32, bool),
    robust: Robust,
    scale: u64,
) -> Res<Measured> {
    let (rows, cols) = (
        8192u64 / scale.isqrt().max(1),
        8192u64 / scale.isqrt().max(1),
    );
    let n = rows * cols;
    let name = format!(
        "rowsum_{}x{unroll}{}_{rows}x{cols}",
        if words == 4 { "vec4" } else { "f32" },
        if trusted { "_t" } else { "" }
    );
    let xb = buffer(lab, n * 4);
    let yb = buffer(lab, rows * 4);
    let data: Vec<f32> = (0..n)
        .map(|i| (pattern(i as u32) >> 8) as f32 / (1u32 << 23) as f32 - 1.0)
        .collect();
    lab.queue.write_buffer(&xb, 0, bytemuck::cast_slice(&data));
    // SAFETY (trusted): indices stay below rows * cols (main loop and tail bounded by p.cols).
    let pipeline = unsafe { pipeline(lab, rowsum_wgsl(words, unroll), trusted) };
    let params = lab.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let pw: [u32; 4] = [rows as u32, (cols / words as u64) as u32, 0, 0];
    lab.queue
        .write_buffer(&params, 0, bytemuck::cast_slice(&pw));
    let bind = lab.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: params.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: xb.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: yb.as_entire_binding(),
            },
        ],
    });
    let groups = if rows <= 65535 {
        [rows as u32, 1, 1]
    } else {
        [65535, rows.div_ceil(65535) as u32, 1]
    };
    let what = Work::Dispatch(&pipeline, &bind, groups);
    let timer = Timer::new(lab);
    let one = timer.time(lab, &what, 1)?;
    let got = read_buffer(lab, &yb, 0, rows * 4)?;
    let ok = got.iter().enumerate().all(|(r, &g)| {
        let row = &data[r * cols as usize..(r + 1) * cols as usize];
        let want: f64 = row.iter().map(|&v| v as f64).sum();
        let scale: f64 = row.iter().map(|&v| (v as f64).abs()).sum();
        ((f32::from_bits(g) as f64) - want).abs() <= 1e-5 * scale
    });
    let (ns, d) = timer.median(lab, &what, one)?;
    Ok(Measured {
        name,
        robust,
        ms: ns / 1e6,
        gbps: ((n + rows) * 4) as f64 / ns,
        dispatches: d,
        ok,
    })
}

/// The variants: the runtime's plain copy first (baseline), then one factor at a time.
fn variants(robust: Robust) -> Vec<Variant> {
    let b = Variant::default;
    let vec4 = || Variant { words: 4, ..b() };
    let mut v = vec![];
    if robust != Robust::Default {
        // The factors that could interact with the device's checks.
        v.push(b());
        v.push(vec4());
        v.push(Variant { k: 4, ..vec4() });
        v.push(Variant {
            k: 4,
            trusted: true,
            guard: false,
            ..vec4()
        });
        v.push(Variant {
            trusted: true,
            guard: false,
            ..vec4()
        });
        v.push(Variant {
            read_only: true,
            ..vec4()
        });
        v.push(Variant {
            persistent: Some(132 * 8),
            ..vec4()
        });
        v.push(Variant { k: 4, ..b() });
        v.push(Variant {
            buffer_copy: true,
            ..b()
        });
        return v;
    }
    v.push(b());
    v.push(Variant { words: 2, ..b() });
    v.push(vec4());
    for wg in [64, 128, 512, 1024] {
        v.push(Variant { wg, ..vec4() });
    }
    for wg in [64, 1024] {
        v.push(Variant { wg, ..b() });
    }
    for k in [2, 4, 8] {
        v.push(Variant { k, ..b() });
    }
    for k in [2, 4] {
        v.push(Variant { k, ..vec4() });
    }
    v.push(Variant {
        k: 4,
        wg: 128,
        ..vec4()
    });
    for g in [132 * 2, 132 * 8, 132 * 32, 132 * 128] {
        v.push(Variant {
            persistent: Some(g),
            ..vec4()
        });
    }
    v.push(Variant {
        persistent: Some(132 * 8),
        k: 4,
        ..vec4()
    });
    v.push(Variant {
        persistent: Some(132 * 8),
        ..b()
    });
    // Checks.
    v.push(Variant {
        trusted: true,
        ..b()
    });
    v.push(Variant {
        trusted: true,
        ..vec4()
    });
    v.push(Variant {
        trusted: true,
        guard: false,
        ..vec4()
    });
    v.push(Variant {
        trusted: true,
        guard: false,
        k: 4,
        ..vec4()
    });
    v.push(Variant {
        trusted: true,
        guard: false,
        ..b()
    });
    // Read-only source.
    v.push(Variant {
        read_only: true,
        ..b()
    });
    v.push(Variant {
        read_only: true,
        ..vec4()
    });
    v.push(Variant {
        read_only: true,
        k: 4,
        ..vec4()
    });
    // Sizes.
    for mib in [64, 1024] {
        v.push(Variant { mib, ..vec4() });
    }
    v.push(Variant { mib: 64, ..b() });
    // Placement.
    v.push(Variant {
        offset: 256,
        ..vec4()
    });
    v.push(Variant {
        same_buffer: true,
        ..vec4()
    });
    v.push(Variant {
        storage_only: true,
        ..vec4()
    });
    // vkCmdCopyBuffer.
    for mib in [64, 256, 1024] {
        v.push(Variant {
            buffer_copy: true,
            mib,
            ..b()
        });
    }
    // The baseline once more at the end (drift: clocks, heat).
    v.push(b());
    v
}

/// Writes the rows measured so far (after every row, so that a run cut short keeps them).
/// Prints one measurement's row and keeps it (the JSON at `path` rewritten with every row so
/// far), or prints `label` and its error; a wrong result or an error counts in `failed`.
fn report(
    res: Res<Measured>,
    label: &str,
    (rows, failed): (&mut Vec<Measured>, &mut usize),
    path: Option<&str>,
) -> Res<()> {
    match res {
        Ok(m) => {
            println!(
                "{:<34} {:>8} {:>10.4} {:>10.0} {:>5} {:>4}",
                m.name,
                m.robust.name(),
                m.ms,
                m.gbps,
                m.dispatches,
                if m.ok { "ok" } else { "BAD" }
            );
            if !m.ok {
                *failed += 1;
            }
            rows.push(m);
            write_lab_json(path, rows)
        }
        Err(e) => {
            println!("{label} failed: {e}");
            *failed += 1;
            Ok(())
        }
    }
}

fn write_lab_json(path: Option<&str>, rows: &[Measured]) -> Res<()> {
    let Some(path) = path else {
        return Ok(());
    };
    let doc = serde_json::json!({
        "tool": "tfwgpu-bench ops --copy-lab",
        "results": rows.iter().map(|m| serde_json::json!({
            "variant": m.name, "robust": m.robust.name(), "ms": m.ms, "gbps": m.gbps,
            "dispatches": m.dispatches, "ok": m.ok,
        })).collect::<Vec<_>>(),
    });
    std::fs::write(path, serde_json::to_string_pretty(&doc).expect("json"))
        .map_err(|e| format!("{path}: {e}"))
}

pub fn run(args: &[String]) -> Res<()> {
    if let Some(ms) = flag(args, "--warm-ms") {
        let ms: u64 = ms.parse().map_err(|_| "bad --warm-ms")?;
        crate::cases::WARM_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
    }
    let small = args.iter().any(|a| a == "--small");
    // On CPU adapters (lavapipe) every size is divided by 64 (256 MiB -> 4 MiB).
    let scale = if small { 64 } else { 1 };
    let configs: Vec<Robust> = match flag(args, "--robust") {
        None | Some("all") => vec![Robust::Default, Robust::Rba1, Robust::None],
        Some(list) => list
            .split(',')
            .map(|s| match s {
                "default" => Ok(Robust::Default),
                "rba1" => Ok(Robust::Rba1),
                "none" => Ok(Robust::None),
                _ => Err(format!("--robust: unknown {s:?}")),
            })
            .collect::<Res<_>>()?,
    };
    let only: Option<Vec<String>> =
        flag(args, "--variants").map(|l| l.split(',').map(str::to_string).collect());
    let path = flag(args, "--json");
    let mut rows = vec![];
    let mut failed = 0;
    for robust in configs {
        let t0 = Instant::now();
        println!("== copy lab, device robustness: {}", robust.name());
        let lab = match open(robust) {
            Ok(l) => l,
            Err(e) => {
                println!("   cannot open: {e}");
                failed += 1;
                continue;
            }
        };
        println!(
            "{:<34} {:>8} {:>10} {:>10} {:>5} {:>4}",
            "variant", "robust", "ms", "GB/s", "d", "ok"
        );
        for v in variants(robust) {
            if only.as_ref().is_some_and(|o| !o.contains(&v.name())) {
                continue;
            }
            let label = format!("{:<34}", v.name());
            let res = run_variant(&lab, &v, robust, scale);
            report(res, &label, (&mut rows, &mut failed), path)?;
        }
        for rs in [
            (1, 1, false),
            (1, 4, false),
            (4, 1, false),
            (4, 4, false),
            (1, 1, true),
            (1, 4, true),
            (4, 1, true),
            (4, 4, true),
        ] {
            if robust != Robust::Default && !rs.2 {
                continue;
            }
            if only
                .as_ref()
                .is_some_and(|o| !o.iter().any(|x| x == "rowsum"))
            {
                continue;
            }
            let label = format!("rowsum {rs:?}");
            let res = run_rowsum(&lab, rs, robust, scale);
            report(res, &label, (&mut rows, &mut failed), path)?;
        }
        println!("   ({:.1} s)", t0.elapsed().as_secs_f64());
    }
    write_lab_json(path, &rows)?;
    if failed > 0 {
        Err(format!("copy lab: {failed} variant(s) failed"))
    } else {
        Ok(())
    }
}
