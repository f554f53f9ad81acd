//! `tfwgpu-bench coopdirect`: an experiment for the float16 1x1 rows (issue 6): cooperative
//! fragments loaded straight from the storage buffers, no staging in workgroup memory.
//!
//! Session 20 measured (bench/RESULTS.md) that this driver keeps one workgroup per SM as soon
//! as a workgroup declares more than ~24 KiB of workgroup memory, whatever its registers, and
//! that the 1x1 rows' tiles (35-45 KiB of staging and scratch) each run alone on their SM, one
//! tile's loads, products and epilogue in sequence. Without staging, a workgroup needs only
//! its epilogue scratch (1 KiB per subgroup and slot), and several workgroups share an SM:
//! one's epilogue can overlap another's loads. The operands' reuse inside a tile then comes
//! from the L1 cache (which the small carve-out leaves large) instead of workgroup memory.
//!
//! Plain products only, as the 1x1 forward: C[M, N] = A[M, K] B[K, N], float16, row-major,
//! float32 accumulation, M, N, K multiples of the tile (checked). Not wired into the runtime:
//! this decides whether such a form is worth a generator path.
//!
//! ```text
//! tfwgpu-bench coopdirect [--shapes M:N:K,..] [--tiles NAME,..] [--dump DIR] [--json FILE]
//! ```
//! Tile names: `d<BM>x<BN>_<SGM>x<SGN>_s<S>` (subgroups along M and N; S scratch slots per
//! subgroup, so the epilogue takes (accumulators / S) rounds).

use crate::occupancy::map_read;
use crate::ops::copylab::{bind_buffers, compute_pipeline};
use serde_json::json;

type Res<T> = Result<T, String>;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tile {
    pub bm: u32,
    pub bn: u32,
    pub sgm: u32,
    pub sgn: u32,
    pub slots: u32,
}

impl Tile {
    pub fn parse(s: &str) -> Res<Tile> {
        let bad = || format!("bad tile {s} (d<BM>x<BN>_<SGM>x<SGN>_s<S>)");
        let rest = s.strip_prefix('d').ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split('_').collect();
        if parts.len() != 3 {
            return Err(bad());
        }
        let pair = |p: &str| -> Res<(u32, u32)> {
            let (a, b) = p.split_once('x').ok_or_else(bad)?;
            Ok((a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?))
        };
        let (bm, bn) = pair(parts[0])?;
        let (sgm, sgn) = pair(parts[1])?;
        let slots: u32 = parts[2]
            .strip_prefix('s')
            .ok_or_else(bad)?
            .parse()
            .map_err(|_| bad())?;
        let t = Tile {
            bm,
            bn,
            sgm,
            sgn,
            slots,
        };
        let (tm, tn) = t.frags();
        if sgm == 0
            || sgn == 0
            || tm == 0
            || tn == 0
            || bm % (16 * sgm) != 0
            || bn % (16 * sgn) != 0
        {
            return Err(bad());
        }
        if slots == 0 || (tm * tn) % slots != 0 {
            return Err(format!(
                "{s}: the slots must divide the {} accumulators",
                tm * tn
            ));
        }
        Ok(t)
    }

    pub fn name(&self) -> String {
        format!(
            "d{}x{}_{}x{}_s{}",
            self.bm, self.bn, self.sgm, self.sgn, self.slots
        )
    }

    fn frags(&self) -> (u32, u32) {
        (
            self.bm / self.sgm.max(1) / 16,
            self.bn / self.sgn.max(1) / 16,
        )
    }

    pub fn threads(&self, lanes: u32) -> u32 {
        self.sgm * self.sgn * lanes
    }

    pub fn shared_bytes(&self) -> u32 {
        self.sgm * self.sgn * self.slots * 1024
    }

    /// The shader: a workgroup per BM x BN tile of C; its subgroups load their A and B
    /// fragments from the storage buffers at each step of 16 of K (a loop, not unrolled),
    /// then write their accumulators through their scratch slots, S at a time.
    pub fn wgsl(&self, lanes: u32) -> String {
        use std::fmt::Write;
        let (tm, tn) = self.frags();
        let sg = self.sgm * self.sgn;
        let mut s = String::new();
        let _ = write!(
            s,
            "enable f16;
enable wgpu_cooperative_matrix;

struct P {{ m: u32, n: u32, k: u32, pad: u32 }}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> a: array<f16>;
@group(0) @binding(2) var<storage, read> b: array<f16>;
@group(0) @binding(3) var<storage, read_write> c: array<vec4<u32>>;
var<workgroup> sc: array<f32, {scl}>;

@compute @workgroup_size({threads})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let sgi = lid / {lanes}u;
    let lane = lid % {lanes}u;
    let row0 = wid.y * {bm}u + (sgi / {sgn}u) * {subm}u;
    let col0 = wid.x * {bn}u + (sgi % {sgn}u) * {subn}u;
    let lda = p.k;
    let ldb = p.n;
",
            scl = sg * self.slots * 256,
            threads = self.threads(lanes),
            bm = self.bm,
            bn = self.bn,
            sgn = self.sgn,
            subm = self.bm / self.sgm,
            subn = self.bn / self.sgn,
        );
        for i in 0..tm {
            for j in 0..tn {
                let _ = writeln!(s, "    var acc_{i}_{j} = coop_mat16x16<f32, C>();");
            }
        }
        s.push_str("    for (var k = 0u; k < p.k; k += 16u) {\n");
        for i in 0..tm {
            let _ = writeln!(
                s,
                "        let ia_{i} = (row0 + {r}u) * lda + k;\n        let fa_{i} = coopLoadT<coop_mat16x16<f16, A>>(&a[ia_{i}], lda);",
                r = i * 16
            );
        }
        for j in 0..tn {
            let _ = writeln!(
                s,
                "        let ib_{j} = k * ldb + col0 + {c}u;\n        let fb_{j} = coopLoadT<coop_mat16x16<f16, B>>(&b[ib_{j}], ldb);",
                c = j * 16
            );
        }
        for i in 0..tm {
            for j in 0..tn {
                let _ = writeln!(
                    s,
                    "        acc_{i}_{j} = coopMultiplyAdd(fa_{i}, fb_{j}, acc_{i}_{j});"
                );
            }
        }
        s.push_str("    }\n");
        // The epilogue: rounds of S accumulators per subgroup through its slots.
        let accs: Vec<(u32, u32)> = (0..tm).flat_map(|i| (0..tn).map(move |j| (i, j))).collect();
        for round in accs.chunks(self.slots as usize) {
            for (q, &(i, j)) in round.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "    let sb_{i}_{j} = (sgi * {slots}u + {q}u) * 256u;\n    coopStoreT(acc_{i}_{j}, &sc[sb_{i}_{j}], 16u);",
                    slots = self.slots
                );
            }
            s.push_str("    workgroupBarrier();\n");
            for &(i, j) in round {
                // 32 pieces of 8 halves per 16 x 16 accumulator, one per lane and step.
                let _ = write!(
                    s,
                    "    for (var e = lane; e < 32u; e += {lanes}u) {{
        let r = e / 2u;
        let cc = (e % 2u) * 8u;
        let o = sb_{i}_{j} + r * 16u + cc;
        let gm = row0 + {r0}u + r;
        let gn = col0 + {c0}u + cc;
        c[(gm * p.n + gn) / 8u] = vec4<u32>(pack2x16float(vec2<f32>(sc[o], sc[o + 1u])), pack2x16float(vec2<f32>(sc[o + 2u], sc[o + 3u])), pack2x16float(vec2<f32>(sc[o + 4u], sc[o + 5u])), pack2x16float(vec2<f32>(sc[o + 6u], sc[o + 7u])));
    }}
",
                    r0 = i * 16,
                    c0 = j * 16,
                );
            }
            s.push_str("    workgroupBarrier();\n");
        }
        s.push_str("}\n");
        s
    }
}

const DEFAULT_TILES: &[&str] = &[
    "d128x128_2x4_s1",
    "d128x128_2x4_s2",
    "d64x128_2x4_s1",
    "d64x128_2x4_s2",
    "d128x64_4x2_s1",
    "d64x64_2x2_s1",
    "d64x64_2x2_s2",
    "d128x128_4x4_s1",
    "d32x128_1x4_s1",
];

/// The float16 1x1 rows' products at batch 32 (forward): 64 -> 256, 256 -> 64, 64 -> 64.
const DEFAULT_SHAPES: &[(u32, u32, u32)] =
    &[(100352, 256, 64), (100352, 64, 256), (100352, 64, 64)];

fn f16_bits(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

/// Device with float16 and cooperative matrices, or an explanation.
fn open() -> Res<(wgpu::Adapter, wgpu::Device, wgpu::Queue)> {
    crate::occupancy::open_with(
        "coopdirect",
        wgpu::Features::SHADER_F16
            | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
            | wgpu::Features::TIMESTAMP_QUERY,
        true,
    )
}

struct Run<'a> {
    device: &'a wgpu::Device,
    queue: &'a wgpu::Queue,
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
}

const PASSES: u32 = 64;

impl Run<'_> {
    /// PASSES passes of one dispatch each, timestamps around each: the median span (ns),
    /// and the wall time of the whole submit per dispatch (ns).
    fn time(
        &self,
        pipe: &wgpu::ComputePipeline,
        bind: &wgpu::BindGroup,
        grid: (u32, u32),
    ) -> Res<(f64, f64)> {
        let mut enc = self.device.create_command_encoder(&Default::default());
        for q in 0..PASSES {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &self.queries,
                    beginning_of_pass_write_index: Some(2 * q),
                    end_of_pass_write_index: Some(2 * q + 1),
                }),
            });
            pass.set_pipeline(pipe);
            pass.set_bind_group(0, bind, &[]);
            pass.dispatch_workgroups(grid.0, grid.1, 1);
        }
        enc.resolve_query_set(&self.queries, 0..2 * PASSES, &self.resolve, 0);
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.readback, 0, 16 * u64::from(PASSES));
        let t0 = std::time::Instant::now();
        self.queue.submit([enc.finish()]);
        let ticks: Vec<u64> = map_read(self.device, &self.readback)?;
        let wall = t0.elapsed().as_secs_f64() * 1e9 / f64::from(PASSES);
        let period = f64::from(self.queue.get_timestamp_period());
        let mut spans: Vec<f64> = ticks
            .chunks(2)
            .map(|t| t[1].saturating_sub(t[0]) as f64 * period)
            .collect();
        spans.sort_by(f64::total_cmp);
        Ok((spans[spans.len() / 2], wall))
    }
}

pub fn run(args: &[String]) -> Res<()> {
    use wgpu::util::DeviceExt;
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let tiles: Vec<Tile> = match flag("--tiles") {
        Some(l) => l.split(',').map(Tile::parse).collect::<Res<_>>()?,
        None => DEFAULT_TILES
            .iter()
            .map(|t| Tile::parse(t))
            .collect::<Res<_>>()?,
    };
    let shapes: Vec<(u32, u32, u32)> = match flag("--shapes") {
        Some(l) => l
            .split(',')
            .map(|s| {
                let v: Vec<u32> = s.split(':').filter_map(|x| x.parse().ok()).collect();
                if v.len() == 3 {
                    Ok((v[0], v[1], v[2]))
                } else {
                    Err(format!("bad shape {s} (M:N:K)"))
                }
            })
            .collect::<Res<_>>()?,
        None => DEFAULT_SHAPES.to_vec(),
    };
    if let Some(dir) = flag("--dump") {
        // (Named `coop_*` so that `tfwgpu-shader-stats --wgsl-dir` compiles them as SPIR-V 1.6.)
        std::fs::create_dir_all(dir).map_err(|e| format!("{dir}: {e}"))?;
        for t in &tiles {
            let f = format!("{dir}/coop_direct_{}.wgsl", t.name());
            std::fs::write(&f, t.wgsl(32)).map_err(|e| format!("{f}: {e}"))?;
        }
    }
    let (adapter, device, queue) = open()?;
    let info = adapter.get_info();
    let lanes = info.subgroup_min_size.max(1);
    if info.subgroup_min_size != info.subgroup_max_size {
        return Err(format!(
            "{}: subgroups of {}..{} lanes; the shader needs one size",
            info.name, info.subgroup_min_size, info.subgroup_max_size
        ));
    }
    println!(
        "adapter: {} ({:?}, driver {} {}); subgroup {lanes}",
        info.name, info.backend, info.driver, info.driver_info
    );
    let run = Run {
        device: &device,
        queue: &queue,
        queries: device.create_query_set(&wgpu::QuerySetDescriptor {
            label: None,
            ty: wgpu::QueryType::Timestamp,
            count: 2 * PASSES,
        }),
        resolve: device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: 16 * u64::from(PASSES),
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        }),
        readback: device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: 16 * u64::from(PASSES),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }),
    };
    println!(
        "{:>20} {:>22} {:>8} {:>9} {:>9} {:>8} {:>9}",
        "shape M:N:K", "tile", "shared", "busy us", "wall us", "TFLOP/s", "rel err"
    );
    let mut rows = vec![];
    let mut wrong = 0;
    for &(m, n, k) in &shapes {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            ((rng >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let ah: Vec<u16> = (0..m as usize * k as usize)
            .map(|_| f16_bits(next()))
            .collect();
        let bh: Vec<u16> = (0..k as usize * n as usize)
            .map(|_| f16_bits(next()))
            .collect();
        let abuf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("a"),
            contents: bytemuck::cast_slice(&ah),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let bbuf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("b"),
            contents: bytemuck::cast_slice(&bh),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let cbytes = u64::from(m) * u64::from(n) * 2;
        let cbuf = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("c"),
            size: cbytes,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let cread = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("c readback"),
            size: cbytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let params = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: bytemuck::cast_slice(&[m, n, k, 0u32]),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        for t in &tiles {
            let shape = format!("{m}:{n}:{k}");
            if m % t.bm != 0 || n % t.bn != 0 || k % 16 != 0 {
                println!(
                    "{shape:>20} {:>22} skipped: not a multiple of the tile",
                    t.name()
                );
                continue;
            }
            if t.threads(lanes) > adapter.limits().max_compute_invocations_per_workgroup
                || t.shared_bytes() > adapter.limits().max_compute_workgroup_storage_size
            {
                println!(
                    "{shape:>20} {:>22} skipped: over the adapter's workgroup limits",
                    t.name()
                );
                continue;
            }
            // SAFETY: every index is in range: the grid covers C exactly (M, N multiples of
            // the tile), fragments read rows < M of A and rows < K of B (K a multiple of 16).
            let pipe = unsafe { compute_pipeline(&device, t.wgsl(lanes), true) };
            let bind = bind_buffers(&device, &pipe, &[&params, &abuf, &bbuf, &cbuf]);
            let grid = (n / t.bn, m / t.bm);
            // Poison C, run once, check 512 sampled outputs against float64 sums.
            let poison = vec![0x7e00u16; m as usize * n as usize];
            queue.write_buffer(&cbuf, 0, bytemuck::cast_slice(&poison));
            let mut enc = device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pipe);
                pass.set_bind_group(0, &bind, &[]);
                pass.dispatch_workgroups(grid.0, grid.1, 1);
            }
            enc.copy_buffer_to_buffer(&cbuf, 0, &cread, 0, cbytes);
            queue.submit([enc.finish()]);
            let got: Vec<u16> = map_read(&device, &cread)?;
            let mut err: f64 = 0.0;
            for q in 0..512u64 {
                let idx = (q.wrapping_mul(2_654_435_761) % (u64::from(m) * u64::from(n))) as usize;
                let (r, cc) = (idx / n as usize, idx % n as usize);
                let (mut want, mut scale) = (0f64, 0f64);
                for kk in 0..k as usize {
                    let x = f64::from(half::f16::from_bits(ah[r * k as usize + kk]).to_f32())
                        * f64::from(half::f16::from_bits(bh[kk * n as usize + cc]).to_f32());
                    want += x;
                    scale += x.abs();
                }
                let g = f64::from(half::f16::from_bits(got[idx]).to_f32());
                let e = if g.is_nan() {
                    f64::INFINITY
                } else {
                    (g - want).abs() / scale.max(1e-30)
                };
                err = err.max(e);
            }
            // Warm-up, then the median of three timed submits.
            for _ in 0..3 {
                run.time(&pipe, &bind, grid)?;
            }
            let mut samples = vec![];
            for _ in 0..3 {
                samples.push(run.time(&pipe, &bind, grid)?);
            }
            samples.sort_by(|x, y| x.0.total_cmp(&y.0));
            let (busy, wall) = samples[1];
            let tflops = 2.0 * f64::from(m) * f64::from(n) * f64::from(k) / busy / 1e3;
            println!(
                "{shape:>20} {:>22} {:>8} {:>9.1} {:>9.1} {:>8.1} {:>9.1e}",
                t.name(),
                t.shared_bytes(),
                busy / 1e3,
                wall / 1e3,
                tflops,
                err
            );
            // (Each sampled output's error against the sum of |products|: float16 rounding
            // of the result, 2^-11, bounds it; 1e-3 as the conv bench.)
            if err > 1e-3 {
                println!(
                    "{shape:>20} {:>22} WRONG: relative error {err:.1e}",
                    t.name()
                );
                wrong += 1;
            }
            rows.push(json!({
                "m": m, "n": n, "k": k, "tile": t.name(), "shared_bytes": t.shared_bytes(),
                "threads": t.threads(lanes), "busy_us": busy / 1e3, "wall_us": wall / 1e3,
                "rel_err": err,
            }));
        }
    }
    if let Some(path) = flag("--json") {
        let doc = json!({
            "tool": "tfwgpu-bench coopdirect", "adapter": info.name, "driver": info.driver,
            "driver_info": info.driver_info, "results": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    if wrong > 0 {
        return Err(format!("{wrong} row(s) over the relative error bound 1e-3"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every default tile's shader is valid WGSL with cooperative matrices and translates to
    /// SPIR-V (naga, no device: lavapipe has no cooperative matrices).
    #[test]
    fn default_tiles_translate() {
        for name in DEFAULT_TILES {
            let t = Tile::parse(name).unwrap();
            assert_eq!(&t.name(), name);
            let src = t.wgsl(32);
            let module = naga::front::wgsl::parse_str(&src)
                .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(&src)));
            let info = naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::all(),
            )
            .validate(&module)
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
            let opts = naga::back::spv::Options {
                lang_version: (1, 6),
                ..Default::default()
            };
            naga::back::spv::write_vec(&module, &info, &opts, None)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn tile_names_checked() {
        assert!(Tile::parse("d128x128_2x4_s3").is_err());
        assert!(Tile::parse("d100x128_2x4_s1").is_err());
        assert_eq!(Tile::parse("d64x64_2x2_s2").unwrap().shared_bytes(), 8192);
    }
}
