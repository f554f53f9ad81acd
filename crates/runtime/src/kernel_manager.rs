//! KernelManager: the compiled-pipeline cache.
//!
//! Pipelines are keyed by (kernel, dtype, specialization). The specialization names a variant
//! (an op inside a family, a tile shape), never a tensor shape: shapes travel in uniforms.
//! The cache is LRU-bounded by `TFWGPU_KERNEL_CACHE_SIZE` (default 512).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::exec::Pipeline;
use crate::{DType, Error, Result};

/// Identifies one compiled pipeline.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    pub kernel: &'static str,
    pub dtype: Option<DType>,
    pub specialization: String,
}

impl PipelineKey {
    pub fn new(
        kernel: &'static str,
        dtype: Option<DType>,
        specialization: impl Into<String>,
    ) -> Self {
        PipelineKey {
            kernel,
            dtype,
            specialization: specialization.into(),
        }
    }
}

/// A fast hasher for the runtime's per-dispatch lookups (pipeline keys, bind groups): the
/// multiply-rotate hash of rustc's FxHasher. The keys are the runtime's own (no input an
/// adversary controls), so the DoS resistance of the standard SipHash buys nothing here and
/// costs a good part of a lookup.
#[derive(Clone, Copy, Default)]
pub(crate) struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(b) ^ ((rest.len() as u64) << 56));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.write_u64(i as u64);
    }

    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }

    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// `HashMap` with [`FastHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FastHasher>>;

/// Cache counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub entries: u64,
    pub capacity: u64,
}

struct Entry {
    pipeline: Arc<Pipeline>,
    last_used: u64,
}

struct State {
    entries: FastMap<PipelineKey, Entry>,
    clock: u64,
    stats: CacheStats,
}

/// Thread-safe pipeline cache.
pub struct KernelManager {
    /// This cache's number in the process (never reused): what a pipeline kept outside the
    /// cache is checked against (`KernelContext::pipeline_kept`).
    id: u64,
    device: wgpu::Device,
    capacity: usize,
    state: Mutex<State>,
    /// Serializes compilation so that two threads missing on the same key compile once.
    compile_lock: Mutex<()>,
    /// The shared layouts of the binding convention, by number of storage bindings.
    layouts: Mutex<HashMap<usize, (wgpu::BindGroupLayout, wgpu::PipelineLayout, bool)>>,
}

/// The number of storage bindings of a shader that follows the binding convention exactly:
/// every resource in group 0, `@binding(0) var<uniform>`, then `var<storage, read_write>` at
/// bindings 1..=n, each of them used beyond its declaration. `None` for anything else (such a
/// shader keeps the layout wgpu derives from it, which leaves unused bindings out).
pub fn convention_bindings(wgsl: &str) -> Option<usize> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut uniform = false;
    let mut storage: Vec<(u32, &str)> = vec![];
    let mut rest = wgsl;
    while let Some(i) = rest.find("@binding(") {
        let head = &rest[..i];
        let after = &rest[i + "@binding(".len()..];
        let close = after.find(')')?;
        let binding: u32 = after[..close].trim().parse().ok()?;
        // The declaration's own attributes: from the previous `;` or `}` to here.
        let attrs: String = head[head.rfind([';', '}']).map_or(0, |j| j + 1)..]
            .split_whitespace()
            .collect();
        if attrs.matches("@group(").count() != 1 || !attrs.contains("@group(0)") {
            return None;
        }
        let end = after.find(';')?;
        let decl = after[close + 1..end].trim_start().strip_prefix("var<")?;
        let kind_end = decl.find('>')?;
        let kind: String = decl[..kind_end].split_whitespace().collect();
        let name_part = decl[kind_end + 1..].trim_start();
        let name = &name_part[..name_part.find(|c: char| !ident(c))?];
        match (binding, kind.as_str()) {
            (0, "uniform") if !uniform => uniform = true,
            (b, "storage,read_write") if b > 0 && !name.is_empty() => storage.push((b, name)),
            _ => return None,
        }
        rest = &after[end..];
    }
    if wgsl.matches("@group(").count() != storage.len() + 1 || !uniform {
        return None;
    }
    storage.sort();
    let used = |name: &str| {
        wgsl.match_indices(name)
            .filter(|(i, _)| {
                let before = wgsl[..*i].chars().next_back();
                let after = wgsl[i + name.len()..].chars().next();
                !before.is_some_and(ident) && !after.is_some_and(ident)
            })
            .count()
            >= 2
    };
    for (k, (b, name)) in storage.iter().enumerate() {
        if *b != k as u32 + 1 || !used(name) {
            return None;
        }
    }
    Some(storage.len())
}

/// How a shader module is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checks {
    /// wgpu's runtime bounds checks stay on (the default for every kernel).
    Checked,
    /// The kernel's indexing is proven in range: skip runtime bounds checks.
    Trusted,
}

/// Source of a compute shader: WGSL text, the entry point, and whether bounds checks can be
/// skipped.
pub struct ShaderSource {
    pub wgsl: String,
    pub entry: &'static str,
    pub checks: Checks,
}

impl ShaderSource {
    /// A checked shader with entry point `main`.
    pub fn new(wgsl: String) -> Self {
        ShaderSource {
            wgsl,
            entry: "main",
            checks: Checks::Checked,
        }
    }
}
impl KernelManager {
    pub(crate) fn with_capacity(device: wgpu::Device, capacity: usize) -> Self {
        let capacity = capacity.max(1);
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        KernelManager {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            device,
            capacity,
            state: Mutex::new(State {
                entries: FastMap::default(),
                clock: 0,
                stats: CacheStats {
                    capacity: capacity as u64,
                    ..Default::default()
                },
            }),
            compile_lock: Mutex::new(()),
            layouts: Mutex::new(HashMap::new()),
        }
    }

    /// The shared layout for `n` storage bindings: a uniform with a dynamic offset at binding
    /// 0, read-write storage at 1..=n. Pipelines that share it share bind groups too.
    ///
    /// With `n` at most the device's `max_dynamic_storage_buffers_per_pipeline_layout` (and
    /// [`MAX_DYNAMIC_STORAGE`]), the storage bindings have dynamic offsets too (the third
    /// value): a bind group then names only each tensor's buffer and size, and the tensors'
    /// offsets are given at each dispatch, so one bind group serves a kernel wherever in its
    /// heap TensorFlow's allocator put the tensors this time (in a Keras training step they move
    /// every step: the bind-group cache missed ~55 of 66 dispatches per CNN step).
    /// `TFWGPU_DYNAMIC_STORAGE=0`: static storage offsets, as before.
    fn shared_layout(&self, n: usize) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout, bool) {
        self.layouts
            .lock()
            .entry(n)
            .or_insert_with(|| {
                let dynamic = dynamic_storage()
                    && n <= MAX_DYNAMIC_STORAGE
                    && n <= self
                        .device
                        .limits()
                        .max_dynamic_storage_buffers_per_pipeline_layout
                        as usize;
                let buffer = |binding: u32, ty, dynamic| wgpu::BindGroupLayoutEntry {
                    binding,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty,
                        has_dynamic_offset: dynamic,
                        min_binding_size: None,
                    },
                    count: None,
                };
                let mut entries = vec![buffer(0, wgpu::BufferBindingType::Uniform, true)];
                for b in 1..=n as u32 {
                    entries.push(buffer(
                        b,
                        wgpu::BufferBindingType::Storage { read_only: false },
                        dynamic,
                    ));
                }
                let label = format!("tfwgpu convention {n}");
                let bgl = self
                    .device
                    .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                        label: Some(&label),
                        entries: &entries,
                    });
                let pl = self
                    .device
                    .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                        label: Some(&label),
                        bind_group_layouts: &[Some(&bgl)],
                        immediate_size: 0,
                    });
                (bgl, pl, dynamic)
            })
            .clone()
    }

    /// This cache's number in the process (see `id`).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        let st = self.state.lock();
        let mut s = st.stats;
        s.entries = st.entries.len() as u64;
        s
    }

    fn lookup(&self, key: &PipelineKey, count: bool) -> Option<Arc<Pipeline>> {
        let mut st = self.state.lock();
        st.clock += 1;
        let now = st.clock;
        let found = st.entries.get_mut(key).map(|e| {
            e.last_used = now;
            e.pipeline.clone()
        });
        if found.is_some() && count {
            st.stats.hits += 1;
        }
        found
    }

    /// Returns the pipeline for `key`, compiling `source()` on a miss.
    pub fn get(
        &self,
        key: PipelineKey,
        source: impl FnOnce() -> ShaderSource,
    ) -> Result<Arc<Pipeline>> {
        if let Some(p) = self.lookup(&key, true) {
            return Ok(p);
        }
        let _guard = self.compile_lock.lock();
        // Another thread may have compiled it while we waited.
        if let Some(p) = self.lookup(&key, true) {
            return Ok(p);
        }
        let pipeline = Arc::new(self.compile(&key, source())?);
        let mut st = self.state.lock();
        st.stats.misses += 1;
        while st.entries.len() >= self.capacity {
            let oldest = st
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone())
                .expect("non-empty");
            st.entries.remove(&oldest);
            st.stats.evictions += 1;
        }
        st.clock += 1;
        let now = st.clock;
        st.entries.insert(
            key,
            Entry {
                pipeline: pipeline.clone(),
                last_used: now,
            },
        );
        Ok(pipeline)
    }

    /// True when `key` is cached (does not count as a hit).
    pub fn contains(&self, key: &PipelineKey) -> bool {
        self.state.lock().entries.contains_key(key)
    }

    fn compile(&self, key: &PipelineKey, src: ShaderSource) -> Result<Pipeline> {
        let label = format!("{}:{:?}:{}", key.kernel, key.dtype, key.specialization);
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(src.wgsl.as_str().into()),
        };
        let module = match src.checks {
            Checks::Checked => self.device.create_shader_module(desc),
            // SAFETY: the kernel declares its indexing proven in range (see its module).
            Checks::Trusted => unsafe {
                self.device
                    .create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            },
        };
        let create = |layout: Option<&wgpu::PipelineLayout>| {
            self.device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(&label),
                    layout,
                    module: &module,
                    entry_point: Some(src.entry),
                    compilation_options: Default::default(),
                    cache: None,
                })
        };
        // The binding convention's shared layout where the shader follows it (bind groups cached
        // across dispatches, see `ExecutionContext::dispatch`), else the layout wgpu derives.
        let storage = convention_bindings(&src.wgsl);
        let shared = storage.map(|n| self.shared_layout(n));
        let pipeline = create(shared.as_ref().map(|s| &s.1));
        let dynamic_storage = shared.as_ref().is_some_and(|s| s.2);
        if let Some(e) = pollster::block_on(scope.pop()) {
            if shared.is_none() {
                return Err(Error::Gpu(format!("compiling kernel {label}: {e}")));
            }
            // The shader's own layout may still work (a binding it declares in a way the scan
            // misread): say so and try it.
            tracing::warn!("kernel {label}: the shared layout was refused ({e}); using its own");
            let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
            let pipeline = create(None);
            if let Some(e) = pollster::block_on(scope.pop()) {
                return Err(Error::Gpu(format!("compiling kernel {label}: {e}")));
            }
            let layout = pipeline.get_bind_group_layout(0);
            return Ok(Pipeline {
                pipeline,
                layout,
                label: label.into(),
                storage_bindings: None,
                dynamic_storage: false,
            });
        }
        let layout = match shared {
            Some((bgl, _, _)) => bgl,
            None => pipeline.get_bind_group_layout(0),
        };
        tracing::debug!("compiled {label}");
        Ok(Pipeline {
            pipeline,
            layout,
            label: label.into(),
            storage_bindings: storage,
            dynamic_storage,
        })
    }
}

/// Most storage bindings of a shared layout with dynamic storage offsets (the offsets of one
/// dispatch are kept on the stack).
pub const MAX_DYNAMIC_STORAGE: usize = 32;

/// Whether shared layouts give their storage bindings dynamic offsets (`TFWGPU_DYNAMIC_STORAGE`,
/// default on).
fn dynamic_storage() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("TFWGPU_DYNAMIC_STORAGE").map_or(true, |v| !matches!(v.trim(), "0" | ""))
    })
}

#[cfg(test)]
mod tests {
    use super::convention_bindings;

    #[test]
    fn convention_bindings_reads_only_the_exact_convention() {
        let ok = "struct Params { n: u32 };
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0)  @binding(2)  var<storage,read_write> out_x: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) { out_x[g.x] = bitcast<u32>(a[g.x]) + p.n; }";
        assert_eq!(convention_bindings(ok), Some(2));
        let only_uniform = "@group(0) @binding(0) var<uniform> p: P;\nfn main() { let x = p.n; }";
        assert_eq!(convention_bindings(only_uniform), Some(0));
        // A declared tensor the shader never uses: wgpu's own layout leaves it out.
        assert_eq!(
            convention_bindings(&ok.replace("bitcast<u32>(a[g.x])", "1u")),
            None
        );
        // `a` inside another identifier does not count as a use.
        assert_eq!(
            convention_bindings(&ok.replace("bitcast<u32>(a[g.x])", "bitcast<u32>(aa[g.x])")),
            None
        );
        assert_eq!(
            convention_bindings(&ok.replace("@binding(2)", "@binding(3)")),
            None
        );
        assert_eq!(
            convention_bindings(&ok.replace("@binding(2)", "@binding(1)")),
            None
        );
        assert_eq!(
            convention_bindings(&ok.replace("storage, read_write", "storage, read")),
            None
        );
        assert_eq!(
            convention_bindings(&ok.replace("@group(0) @binding(1)", "@group(1) @binding(1)")),
            None
        );
        assert_eq!(
            convention_bindings(&ok.replace("var<uniform> p", "var<storage, read_write> p")),
            None
        );
        assert_eq!(convention_bindings("fn main() {}"), None);
    }
}
