//! `tfwgpu-bench occupancy`: how many workgroups the driver keeps resident at once, for a
//! given workgroup size, workgroup memory and register footprint (issue 6).
//!
//! The cooperative-matrix tiles are planned around "one or two workgroups per SM", a figure
//! so far inferred from timings and register counts (NOTES-coop.md). This measures it: each
//! workgroup of a large grid increments a counter when it starts, records the highest value
//! the counter reached, spins long enough that every workgroup the GPU can hold is running
//! at once, and decrements the counter when it ends. The highest value is the number of
//! workgroups that were resident together; divided by the GPU's SMs (or compute units), the
//! workgroups per SM. Workgroup memory is declared and touched (so the driver must give it);
//! live registers are forced with independent multiply-add chains (`--regs`, a request: the
//! driver's count of each probe shader is what `tfwgpu-shader-stats --wgsl-dir` prints for the
//! files `--dump DIR` writes).
//!
//! ```text
//! tfwgpu-bench occupancy [--threads 128,256,512] [--shared-kib 0,16,..] [--regs 0,64,..]
//!                        [--iters N] [--grid N] [--dump DIR] [--json FILE]
//! ```
//!
//! Every combination of the lists is run; the defaults sweep workgroup memory at the fewest
//! registers, then registers without workgroup memory.

use crate::ops::copylab::{bind_buffers, compute_pipeline};
use serde_json::json;

type Res<T> = Result<T, String>;

/// One probe shader's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Probe {
    /// Invocations per workgroup.
    pub threads: u32,
    /// Bytes of workgroup memory (a multiple of 16; at least 16 are declared).
    pub shared: u32,
    /// Floats kept live through the spin (a multiple of 4; 0 and 4 both give one vec4 chain).
    pub regs: u32,
    /// Steps of the spin.
    pub iters: u32,
}

impl Probe {
    pub fn name(&self) -> String {
        format!(
            "occ_t{}_s{}_r{}",
            self.threads,
            self.shared / 1024,
            self.regs
        )
    }

    /// The probe's WGSL: `ctr[0]` counts the running workgroups, `ctr[1]` keeps the highest
    /// count; `out` receives every invocation's chains so nothing is optimised away.
    pub fn wgsl(&self) -> String {
        use std::fmt::Write;
        let vecs = (self.shared / 16).max(1);
        let chains = (self.regs / 4).max(1);
        let mut decl = String::new();
        let mut step = String::new();
        let mut sum = String::from("x");
        for c in 0..chains {
            let _ = writeln!(
                decl,
                "    var r{c} = vec4<f32>(x + {c}.0, x * 0.5 + {c}.25, x - {c}.5, x + 0.125);"
            );
            // Each chain reads its neighbour's previous value: none can be dropped or merged.
            let _ = writeln!(
                step,
                "        r{c} = fma(r{c}, vec4<f32>(0.99997), r{n}.yzwx * 1e-6);",
                n = (c + 1) % chains
            );
            let _ = write!(sum, " + dot(r{c}, vec4<f32>(1.0))");
        }
        format!(
            "@group(0) @binding(0) var<storage, read_write> ctr: array<atomic<u32>, 4>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
var<workgroup> sh: array<vec4<f32>, {vecs}>;

@compute @workgroup_size({threads})
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    if lid == 0u {{
        let now = atomicAdd(&ctr[0], 1u) + 1u;
        atomicMax(&ctr[1], now);
    }}
    for (var i = lid; i < {vecs}u; i += {threads}u) {{
        sh[i] = vec4<f32>(f32(i), f32(wid.x), 1.0, 2.0);
    }}
    workgroupBarrier();
    let x = sh[(lid * 7u + wid.x) % {vecs}u].x * 1e-3;
{decl}    for (var it = 0u; it < {iters}u; it += 1u) {{
{step}    }}
    workgroupBarrier();
    if lid == 0u {{
        atomicSub(&ctr[0], 1u);
    }}
    out[wid.x * {threads}u + lid] = {sum};
}}
",
            threads = self.threads,
            iters = self.iters,
        )
    }
}

fn list(args: &[String], name: &str, default: &[u32]) -> Res<Vec<u32>> {
    match args.iter().position(|a| a == name) {
        None => Ok(default.to_vec()),
        Some(i) => args
            .get(i + 1)
            .ok_or(format!("{name} needs a list"))?
            .split(',')
            .map(|v| v.parse().map_err(|_| format!("bad {name} value {v}")))
            .collect(),
    }
}

/// The probes of the command line (all combinations), or the default sweeps.
pub fn probes(args: &[String]) -> Res<Vec<Probe>> {
    let iters = list(args, "--iters", &[40_000])?[0];
    let given = ["--threads", "--shared-kib", "--regs"]
        .iter()
        .any(|f| args.iter().any(|a| a == f));
    let mut v = vec![];
    if given {
        for t in list(args, "--threads", &[256])? {
            for s in list(args, "--shared-kib", &[0])? {
                for r in list(args, "--regs", &[0])? {
                    v.push(Probe {
                        threads: t,
                        shared: s * 1024,
                        regs: r / 4 * 4,
                        iters,
                    });
                }
            }
        }
    } else {
        for t in [128, 256, 512] {
            for s in [0, 8, 12, 16, 20, 22, 24, 28, 30, 32, 36, 40, 44, 47] {
                v.push(Probe {
                    threads: t,
                    shared: s * 1024,
                    regs: 0,
                    iters,
                });
            }
        }
        for t in [256, 512] {
            for r in [32, 64, 96, 112, 128, 160, 192] {
                v.push(Probe {
                    threads: t,
                    shared: 0,
                    regs: r,
                    iters,
                });
            }
        }
    }
    Ok(v)
}

/// Runs one probe over `grid` workgroups: (highest count of resident workgroups, ms).
pub fn measure(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    p: &Probe,
    grid: u32,
) -> Res<(u32, f64)> {
    use wgpu::util::DeviceExt;
    // SAFETY: not trusted: naga's bounds checks stay.
    let pipeline = unsafe { compute_pipeline(device, p.wgsl(), false) };
    let ctr = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("occupancy counters"),
        contents: &[0u8; 16],
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
    });
    let out = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("occupancy out"),
        size: u64::from(grid) * u64::from(p.threads) * 4,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let readback = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("occupancy readback"),
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let bind = bind_buffers(device, &pipeline, &[&ctr, &out]);
    let mut enc = device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(grid, 1, 1);
    }
    enc.copy_buffer_to_buffer(&ctr, 0, &readback, 0, 16);
    let t0 = std::time::Instant::now();
    queue.submit([enc.finish()]);
    let words: Vec<u32> = map_read(device, &readback)?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    if words[0] != 0 {
        return Err(format!(
            "{}: {} workgroups still counted as running after the dispatch",
            p.name(),
            words[0]
        ));
    }
    Ok((words[1], ms))
}

/// Maps `buf` (MAP_READ, its copies submitted), waits for the device and returns its contents
/// as `T`s; the buffer is unmapped again. Also `tfwgpu-bench coopdirect`'s readbacks.
pub fn map_read<T: bytemuck::Pod>(device: &wgpu::Device, buf: &wgpu::Buffer) -> Res<Vec<T>> {
    buf.slice(..).map_async(wgpu::MapMode::Read, |_| ());
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| e.to_string())?;
    let v = {
        let m = buf
            .slice(..)
            .get_mapped_range()
            .map_err(|e| e.to_string())?;
        bytemuck::cast_slice(&m).to_vec()
    };
    buf.unmap();
    Ok(v)
}

/// Opens the first adapter (a discrete GPU first) with its own limits (workgroup memory up to
/// the adapter's maximum) and `features`; with `experimental`, wgpu's experimental features
/// (cooperative matrices) are enabled. Also `tfwgpu-bench coopdirect`'s device.
pub fn open_with(
    label: &str,
    features: wgpu::Features,
    experimental: bool,
) -> Res<(wgpu::Adapter, wgpu::Device, wgpu::Queue)> {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    adapters.sort_by_key(|a| a.get_info().device_type != wgpu::DeviceType::DiscreteGpu);
    let adapter = adapters.into_iter().next().ok_or("no adapter")?;
    if !adapter.features().contains(features) {
        return Err(format!(
            "{}: lacks {:?}",
            adapter.get_info().name,
            features - adapter.features()
        ));
    }
    let experimental_features = if experimental {
        // SAFETY: the experimental features are used only by the bench's own experiment
        // shaders, which keep to the subset naga translates (fragment pointers bound with
        // `let`).
        unsafe { wgpu::ExperimentalFeatures::enabled() }
    } else {
        wgpu::ExperimentalFeatures::disabled()
    };
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some(label),
        required_features: features,
        required_limits: adapter.limits(),
        experimental_features,
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    }))
    .map_err(|e| e.to_string())?;
    // A validation error (a shader or limit the adapter refuses) is printed, not a panic; the
    // run's results then show it (counters, or a WRONG check).
    device.on_uncaptured_error(std::sync::Arc::new(|e| println!("   wgpu error: {e}")));
    Ok((adapter, device, queue))
}

fn open() -> Res<(wgpu::Adapter, wgpu::Device, wgpu::Queue)> {
    open_with("occupancy", wgpu::Features::empty(), false)
}

pub fn run(args: &[String]) -> Res<()> {
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let grid: u32 = flag("--grid")
        .map_or(Ok(4096), |s| s.parse())
        .map_err(|_| "bad --grid")?;
    if grid == 0 || grid > 65535 {
        return Err(format!("--grid {grid}: 1 to 65535 workgroups"));
    }
    let probes = probes(args)?;
    if let Some(dir) = flag("--dump") {
        std::fs::create_dir_all(dir).map_err(|e| format!("{dir}: {e}"))?;
        for p in &probes {
            let f = format!("{dir}/{}.wgsl", p.name());
            std::fs::write(&f, p.wgsl()).map_err(|e| format!("{f}: {e}"))?;
        }
    }
    let (adapter, device, queue) = open()?;
    let info = adapter.get_info();
    let max_shared = adapter.limits().max_compute_workgroup_storage_size;
    println!(
        "adapter: {} ({:?}, driver {} {}); grid {grid} workgroups",
        info.name, info.backend, info.driver, info.driver_info
    );
    println!(
        "{:>24} {:>8} {:>10} {:>6} {:>10} {:>9}",
        "probe", "threads", "shared B", "regs", "resident", "ms"
    );
    let mut rows = vec![];
    for p in probes {
        if p.shared > max_shared
            || p.threads > adapter.limits().max_compute_invocations_per_workgroup
        {
            println!("{:>24} skipped: over the adapter's limits", p.name());
            continue;
        }
        let (resident, ms) = measure(&device, &queue, &p, grid)?;
        println!(
            "{:>24} {:>8} {:>10} {:>6} {:>10} {:>9.2}",
            p.name(),
            p.threads,
            p.shared,
            p.regs,
            resident,
            ms
        );
        rows.push(json!({
            "probe": p.name(), "threads": p.threads, "shared_bytes": p.shared,
            "regs_requested": p.regs, "iters": p.iters, "grid": grid,
            "resident": resident, "ms": ms,
        }));
    }
    if let Some(path) = flag("--json") {
        let doc = json!({
            "tool": "tfwgpu-bench occupancy",
            "adapter": info.name, "driver": info.driver, "driver_info": info.driver_info,
            "results": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every probe of the default sweeps is valid WGSL (naga, no device).
    #[test]
    fn default_probes_validate() {
        let probes = probes(&[]).unwrap();
        assert!(probes.len() > 40);
        for p in probes {
            let src = p.wgsl();
            let module = naga::front::wgsl::parse_str(&src)
                .unwrap_or_else(|e| panic!("{}: {}", p.name(), e.emit_to_string(&src)));
            naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::all(),
            )
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}: {e:?}", p.name()));
        }
    }

    /// On the machine's adapter (lavapipe in CI): one workgroup alone is counted once, a
    /// grid's residency is between 1 and the grid, and the running count returns to zero
    /// (`measure` fails otherwise).
    #[test]
    fn probe_counts_resident_workgroups() {
        let (_, device, queue) = open().expect("adapter");
        let p = Probe {
            threads: 64,
            shared: 4096,
            regs: 8,
            iters: 200,
        };
        assert_eq!(measure(&device, &queue, &p, 1).unwrap().0, 1);
        let (resident, _) = measure(&device, &queue, &p, 24).unwrap();
        assert!((1..=24).contains(&resident), "resident {resident}");
    }

    #[test]
    fn lists_parse() {
        let args: Vec<String> = [
            "--threads",
            "128,256",
            "--shared-kib",
            "0,36",
            "--regs",
            "130",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let v = probes(&args).unwrap();
        assert_eq!(v.len(), 4);
        assert_eq!(v[1].shared, 36 * 1024);
        assert_eq!(v[3].threads, 256);
        assert_eq!(v[0].regs, 128);
    }
}
