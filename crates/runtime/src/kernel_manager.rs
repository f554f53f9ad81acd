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
    entries: HashMap<PipelineKey, Entry>,
    clock: u64,
    stats: CacheStats,
}

/// Thread-safe pipeline cache.
pub struct KernelManager {
    device: wgpu::Device,
    capacity: usize,
    state: Mutex<State>,
    /// Serializes compilation so that two threads missing on the same key compile once.
    compile_lock: Mutex<()>,
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
        KernelManager {
            device,
            capacity,
            state: Mutex::new(State {
                entries: HashMap::new(),
                clock: 0,
                stats: CacheStats {
                    capacity: capacity as u64,
                    ..Default::default()
                },
            }),
            compile_lock: Mutex::new(()),
        }
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
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&label),
                layout: None,
                module: &module,
                entry_point: Some(src.entry),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("compiling kernel {label}: {e}")));
        }
        let layout = pipeline.get_bind_group_layout(0);
        tracing::debug!("compiled {label}");
        Ok(Pipeline {
            pipeline,
            layout,
            label: label.into(),
        })
    }
}
