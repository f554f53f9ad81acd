//! Device (one adapter + device + queue), the Runtime (all selected devices), and Tensor.

use std::sync::Arc;

use crate::adapter::{AdapterDescription, Selection, enumerate, new_instance, useful_feature_list};
use crate::allocator::{Allocator, AllocatorStats};
use crate::exec::{ExecConfig, ExecStats, ExecutionContext, PendingRead, env_parse};
use crate::kernel::{Attrs, DeviceRef, KernelContext, Operand, Registry, TensorDesc};
use crate::kernel_manager::{CacheStats, KernelManager};
use crate::mirror::HostMirror;
use crate::{DType, Element, Error, HostTensor, Result};

pub(crate) struct DeviceInner {
    pub(crate) desc: AdapterDescription,
    pub(crate) limits: wgpu::Limits,
    pub(crate) features: wgpu::Features,
    pub(crate) exec: Arc<ExecutionContext>,
    pub(crate) alloc: Allocator,
    pub(crate) kernels: KernelManager,
    /// Small host writes, to answer reads of them without a GPU round trip.
    mirror: HostMirror,
    /// Staging buffers of copies from other devices, for reuse (see `Device::gated_write`).
    incoming: parking_lot::Mutex<StagingPool>,
}

/// Staging buffers of copies from other devices ([`Device::gated_write`]), reused: a new
/// buffer mapped at creation costs a driver allocation and wgpu's zero-fill of its memory on
/// the thread that issues the copy (a TensorFlow thread), ~0.1 ms for a few hundred KB on the
/// H200 (bench/RESULTS.md, session 7: uploads), several times per MirroredStrategy step. A
/// landed buffer is mapped again once the batch that copies out of it has completed.
#[derive(Default)]
struct StagingPool {
    /// Landed; the batch that copies out of it has not completed yet.
    used: Vec<(wgpu::Buffer, u64)>,
    /// Being mapped for writing: 0 pending, 1 mapped, 2 failed.
    mapping: Vec<(wgpu::Buffer, Arc<std::sync::atomic::AtomicU8>)>,
    /// Mapped for writing, ready for the next copy.
    ready: Vec<wgpu::Buffer>,
    /// Buffers created, and copies that got one from the pool.
    created: u64,
    reused: u64,
}

/// Staging buffers kept at most, and the largest kept (larger copies get their own).
const STAGING_POOL_BUFFERS: usize = 32;
const STAGING_POOL_MAX_BYTES: u64 = 16 << 20;

impl StagingPool {
    /// The size of the staging buffer a copy of `padded` bytes gets.
    fn class(padded: u64) -> u64 {
        if padded <= STAGING_POOL_MAX_BYTES {
            padded.next_power_of_two().max(256)
        } else {
            padded
        }
    }

    /// Moves buffers along: completed ones are mapped again, mapped ones become ready.
    fn advance(&mut self, exec: &ExecutionContext) {
        let done = exec.completed();
        let mut i = 0;
        while i < self.used.len() {
            if self.used[i].1 <= done {
                let (buf, _) = self.used.swap_remove(i);
                let flag = Arc::new(std::sync::atomic::AtomicU8::new(0));
                let f = flag.clone();
                buf.slice(..).map_async(wgpu::MapMode::Write, move |r| {
                    f.store(
                        if r.is_ok() { 1 } else { 2 },
                        std::sync::atomic::Ordering::Release,
                    );
                });
                self.mapping.push((buf, flag));
            } else {
                i += 1;
            }
        }
        if !self.mapping.is_empty() {
            let _ = exec.device().poll(wgpu::PollType::Poll);
        }
        let mut i = 0;
        while i < self.mapping.len() {
            match self.mapping[i].1.load(std::sync::atomic::Ordering::Acquire) {
                0 => i += 1,
                1 => {
                    let (buf, _) = self.mapping.swap_remove(i);
                    self.ready.push(buf);
                }
                _ => {
                    self.mapping.swap_remove(i);
                }
            }
        }
    }

    /// A mapped buffer of `class` bytes, if one is ready.
    fn take(&mut self, class: u64, exec: &ExecutionContext) -> Option<wgpu::Buffer> {
        if class > STAGING_POOL_MAX_BYTES {
            return None;
        }
        if !self.used.is_empty() || !self.mapping.is_empty() {
            self.advance(exec);
        }
        let i = self.ready.iter().position(|b| b.size() == class)?;
        self.reused += 1;
        Some(self.ready.swap_remove(i))
    }

    /// A landed buffer, free again once batch `batch` of its device completed.
    fn give_back(&mut self, buf: wgpu::Buffer, batch: u64) {
        let kept = self.used.len() + self.mapping.len() + self.ready.len();
        if buf.size() <= STAGING_POOL_MAX_BYTES && kept < STAGING_POOL_BUFFERS {
            self.used.push((buf, batch));
        }
    }
}

/// One opened adapter. Cheap to clone; thread-safe.
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

/// Every device the selection rules chose, opened.
pub struct Runtime {
    pub devices: Vec<Device>,
    /// Every adapter found, chosen or not.
    pub adapters: Vec<AdapterDescription>,
}

/// Settings of a runtime; `Default` reads the `TFWGPU_*` environment variables.
#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    /// Which adapters to open.
    pub selection: Selection,
    /// Batching thresholds.
    pub exec: ExecConfig,
    /// Pipeline-cache capacity (`TFWGPU_KERNEL_CACHE_SIZE`).
    pub kernel_cache_size: usize,
    /// Device-memory limit in bytes (`TFWGPU_MEMORY_LIMIT_MB`); `None` picks one per adapter.
    pub memory_limit: Option<u64>,
    /// Host writes of at most this many bytes are remembered so that reading them back does
    /// not wait for the GPU (`TFWGPU_HOST_MIRROR_BYTES`, default 16384; 0: off). See
    /// `mirror.rs`.
    pub host_mirror_bytes: usize,
}

impl RuntimeOptions {
    /// Options from the environment.
    pub fn from_env() -> Result<Self> {
        Ok(RuntimeOptions {
            selection: Selection::from_env()?,
            exec: ExecConfig::from_env(),
            kernel_cache_size: env_parse::<usize>("TFWGPU_KERNEL_CACHE_SIZE")
                .unwrap_or(512)
                .max(1),
            memory_limit: env_parse::<u64>("TFWGPU_MEMORY_LIMIT_MB").map(|mb| mb << 20),
            host_mirror_bytes: env_parse::<usize>("TFWGPU_HOST_MIRROR_BYTES").unwrap_or(16384),
        })
    }
}

impl Runtime {
    /// Enumerates adapters and opens the ones `TFWGPU_VISIBLE_DEVICES` / `TFWGPU_ADAPTER`
    /// select (by default the best one of each physical GPU).
    pub fn new() -> Result<Runtime> {
        Runtime::with_options(RuntimeOptions::from_env()?)
    }

    /// Like `new`, with explicit options.
    pub fn with_options(opts: RuntimeOptions) -> Result<Runtime> {
        let selection = opts.selection.clone();
        let instance = new_instance();
        let adapters = enumerate(&instance);
        let descs: Vec<_> = adapters
            .iter()
            .enumerate()
            .map(|(i, a)| AdapterDescription::from_adapter(i, a))
            .collect();
        let chosen = selection.choose(&descs)?;
        let mut devices = vec![];
        if chosen.len() > crate::allocator::MAX_DEVICES {
            return Err(Error::NoAdapter(format!(
                "{} devices selected; at most {} can be opened",
                chosen.len(),
                crate::allocator::MAX_DEVICES
            )));
        }
        for (index, i) in chosen.into_iter().enumerate() {
            devices.push(Device::open(&adapters[i], descs[i].clone(), index, &opts)?);
        }
        Ok(Runtime {
            devices,
            adapters: descs,
        })
    }

    /// The first (best) device.
    pub fn device(&self) -> &Device {
        &self.devices[0]
    }
}

fn default_memory_limit(desc: &AdapterDescription) -> u64 {
    let system = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|k| k.parse::<u64>().ok())
                })
        })
        .map(|kb| kb * 1024);
    match (desc.device_type.as_str(), desc.device_memory) {
        // Software and integrated adapters share system memory: take half of it.
        ("cpu" | "integrated", _) => system.map(|b| b / 2).unwrap_or(4 << 30),
        // A discrete adapter: 90% of its device-local memory, leaving room for the driver.
        (_, Some(bytes)) => bytes / 10 * 9,
        // wgpu does not report the memory size of this backend; assume 8 GiB unless told.
        _ => 8 << 30,
    }
}

impl Device {
    /// Opens `adapter` with its own limits and every useful feature it has.
    /// `index` is the device's place in the process (its addresses carry it).
    pub(crate) fn open(
        adapter: &wgpu::Adapter,
        desc: AdapterDescription,
        index: usize,
        opts: &RuntimeOptions,
    ) -> Result<Device> {
        let mut features = wgpu::Features::empty();
        for (f, _) in useful_feature_list() {
            if desc.features.contains(f) {
                features |= f;
            }
        }
        let experimental = if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            // SAFETY: only the cooperative-matrix kernels use the experimental feature, and they
            // are run only where the adapter reports it.
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        };
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("tfwgpu"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: experimental,
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| Error::NoAdapter(format!("opening {}: {e}", desc.name)))?;
        let limit = opts
            .memory_limit
            .unwrap_or_else(|| default_memory_limit(&desc));
        tracing::info!(
            "opened {} ({}, {}, {}), memory limit {} MiB",
            desc.name,
            desc.backend,
            desc.device_type,
            desc.driver,
            limit >> 20
        );
        let mut cfg = opts.exec.clone();
        cfg.spin.get_or_insert(if desc.device_type == "cpu" {
            std::time::Duration::ZERO
        } else {
            crate::exec::DEFAULT_SPIN
        });
        let exec = ExecutionContext::new(device.clone(), queue, cfg);
        let inner = DeviceInner {
            limits: device.limits(),
            features: device.features(),
            alloc: Allocator::new(device.clone(), index, limit),
            kernels: KernelManager::with_capacity(device.clone(), opts.kernel_cache_size),
            exec,
            desc,
            mirror: HostMirror::new(opts.host_mirror_bytes),
            incoming: parking_lot::Mutex::new(StagingPool::default()),
        };
        Ok(Device {
            inner: Arc::new(inner),
        })
    }

    /// The adapter's description (name, backend, driver, type, limits, features).
    pub fn description(&self) -> &AdapterDescription {
        &self.inner.desc
    }

    /// The features enabled on the device.
    pub fn features(&self) -> wgpu::Features {
        self.inner.features
    }

    /// The limits of the device.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.inner.limits
    }

    /// The execution context (batching, synchronization).
    pub fn exec(&self) -> &ExecutionContext {
        &self.inner.exec
    }

    /// The allocator.
    pub fn allocator(&self) -> &Allocator {
        &self.inner.alloc
    }

    /// Memory figures.
    pub fn memory_stats(&self) -> AllocatorStats {
        self.inner.alloc.stats()
    }

    /// Pipeline-cache figures.
    pub fn cache_stats(&self) -> CacheStats {
        self.inner.kernels.stats()
    }

    /// Execution counters.
    pub fn exec_stats(&self) -> ExecStats {
        self.inner.exec.stats()
    }

    // ---- address-level API (what the TensorFlow plugin uses) ----

    /// Allocates `size` bytes of device memory; returns its address.
    pub fn allocate(&self, size: u64) -> Result<u64> {
        self.inner.alloc.allocate(size, &self.inner.exec)
    }

    /// Frees an allocation; its memory is reused only after work recorded so far completes.
    pub fn deallocate(&self, addr: u64) -> Result<()> {
        self.inner.alloc.free(addr, self.inner.exec.tag())
    }

    /// Records a host-to-device copy to `addr`; returns without waiting for the GPU.
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let r = self.inner.alloc.resolve(addr)?;
        if data.len() as u64 > r.remaining {
            return Err(Error::InvalidArgument(format!(
                "a write of {} bytes at {addr:#x} runs past its allocation",
                data.len()
            )));
        }
        if !r.offset.is_multiple_of(4) {
            return Err(Error::InvalidArgument(format!(
                "host-to-device copy to {addr:#x}: the address must be 4-byte aligned"
            )));
        }
        if data.len().is_multiple_of(4) {
            self.inner.exec.upload(&r.buffer, r.offset, data)?;
            self.inner.mirror.wrote(addr, data);
            return Ok(());
        }
        // Copies are made of 4-byte words. The last 1-3 bytes go in with a byte-masked fill,
        // which keeps the other bytes of their word and, being recorded in order, needs no
        // wait (reading the word back to merge it on the host made a one-byte write wait for
        // everything queued: ~0.2 ms on the H200).
        let full = data.len() / 4 * 4;
        if full > 0 {
            self.inner.exec.upload(&r.buffer, r.offset, &data[..full])?;
        }
        let mut tail = [0u8; 4];
        tail[..data.len() - full].copy_from_slice(&data[full..]);
        crate::kernels::fill::fill_bytes(
            &KernelContext::new(&self.inner),
            addr + full as u64,
            (data.len() - full) as u64,
            u32::from_le_bytes(tail),
        )?;
        self.inner.mirror.wrote(addr, data);
        Ok(())
    }

    /// Copies `len` bytes at `addr` back to the host, waiting for the work that produces them.
    pub fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>> {
        let pending = self.read_async(addr, len)?;
        self.finish_read(pending, |bytes| bytes.to_vec())
    }

    /// Copies `dst.len()` bytes at `addr` back into `dst`, waiting for the work that produces
    /// them; large reads are copied out of the mapped memory by several threads.
    pub fn read_into(&self, addr: u64, dst: &mut [u8]) -> Result<()> {
        if self.inner.mirror.read(addr, dst) {
            return Ok(());
        }
        let pending = self.read_async(addr, dst.len())?;
        self.finish_read(pending, |bytes| crate::exec::parallel_read(dst, bytes))
    }

    /// Starts copying `len` bytes at `addr` back to the host without waiting: the copy is
    /// ordered after the work recorded so far and submitted. Finish it with
    /// [`Device::finish_read`].
    pub fn read_async(&self, addr: u64, len: usize) -> Result<ReadInFlight> {
        if len == 0 {
            return Ok(ReadInFlight {
                pending: PendingRead::empty(),
                len: 0,
                mirrored: None,
            });
        }
        let mut bytes = vec![0u8; len];
        if self.inner.mirror.read(addr, &mut bytes) {
            return Ok(ReadInFlight {
                pending: PendingRead::empty(),
                len,
                mirrored: Some(bytes),
            });
        }
        let r = self.inner.alloc.resolve(addr)?;
        if len as u64 > r.remaining {
            return Err(Error::InvalidArgument(format!(
                "a read of {len} bytes at {addr:#x} runs past its allocation"
            )));
        }
        if !r.offset.is_multiple_of(4) {
            return Err(Error::InvalidArgument(format!(
                "device-to-host copy from {addr:#x}: the address must be 4-byte aligned"
            )));
        }
        let pending =
            self.inner
                .exec
                .read_begin(&r.buffer, r.offset, (len as u64).next_multiple_of(4))?;
        Ok(ReadInFlight {
            pending,
            len,
            mirrored: None,
        })
    }

    /// Waits for a read started by [`Device::read_async`] on this device and calls `f` with
    /// its `len` bytes.
    pub fn finish_read<R>(&self, read: ReadInFlight, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let len = read.len;
        if let Some(bytes) = &read.mirrored {
            return Ok(f(bytes));
        }
        self.inner
            .exec
            .read_finish(read.pending, |bytes| f(&bytes[..len.min(bytes.len())]))
    }

    /// Starts copying `len` bytes at `src` on this device to `dst` on device `to`, ordered
    /// on both devices and without waiting for either GPU: see [`Device::gated_write`].
    pub fn copy_to_device(
        &self,
        src: u64,
        to: &Device,
        dst: u64,
        len: usize,
    ) -> Result<IncomingCopy> {
        let read = self.read_async(src, len)?;
        to.gated_write(dst, self, read)
    }

    /// Records on this device, in its order, the write at `dst` of the bytes that `read` (a
    /// read started on device `from`) brings back, and returns at once: a copy between two
    /// devices, ordered on the GPU side instead of on the host.
    ///
    /// The write is a copy from a staging buffer of this device, recorded now; the batch that
    /// holds it, and every later one, is held back from this device's queue until
    /// [`IncomingCopy::land`] has put the bytes into the staging buffer (see
    /// `ExecutionContext::record_gated_copy`). Work recorded here after this call (the
    /// copy's consumers) therefore sees the new bytes, work recorded before does not, and
    /// the host records on as usual; reads of this device, its synchronizations and waits
    /// wait for the bytes. The source side is `read`: recorded and submitted on `from` when
    /// it was started, in `from`'s order.
    ///
    /// Deadlock freedom: a read is held only behind gates registered before it was started,
    /// and a gate opens when its own read (started before it was registered) has landed; so
    /// a chain of waits goes back in time and ends, provided whoever lands the copies does so
    /// in the order their gates were registered (one thread per device that issues copies,
    /// fed in that order, does).
    pub fn gated_write(&self, dst: u64, from: &Device, read: ReadInFlight) -> Result<IncomingCopy> {
        let len = read.len;
        let done = IncomingCopy {
            from: from.clone(),
            to: self.clone(),
            read: None,
            staging: None,
            batch: 0,
            len,
        };
        if len == 0 {
            return Ok(done);
        }
        if let Some(bytes) = &read.mirrored {
            // The source's host mirror had the bytes: nothing to wait for.
            self.write(dst, bytes)?;
            return Ok(done);
        }
        let r = self.inner.alloc.resolve(dst)?;
        let padded = (len as u64).next_multiple_of(4);
        if padded > r.remaining {
            return Err(Error::InvalidArgument(format!(
                "a copy of {len} bytes to {dst:#x} runs past its allocation"
            )));
        }
        if !r.offset.is_multiple_of(4) {
            return Err(Error::InvalidArgument(format!(
                "a copy between devices to {dst:#x}: the address must be 4-byte aligned"
            )));
        }
        let class = StagingPool::class(padded);
        let pooled = {
            let mut pool = self.inner.incoming.lock();
            let b = pool.take(class, &self.inner.exec);
            pool.created += b.is_none() as u64;
            b
        };
        let staging = pooled.unwrap_or_else(|| {
            self.inner
                .exec
                .device()
                .create_buffer(&wgpu::BufferDescriptor {
                    label: Some("tfwgpu incoming copy"),
                    size: class,
                    usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: true,
                })
        });
        self.inner.mirror.written(dst, padded);
        let batch = self
            .inner
            .exec
            .record_gated_copy(&staging, &r.buffer, r.offset, padded)?;
        let mut copy = done;
        copy.read = Some(read);
        copy.staging = Some(staging);
        copy.batch = batch;
        Ok(copy)
    }

    /// Staging buffers of copies from other devices ([`Device::gated_write`]): how many were
    /// created, and how many copies reused one.
    pub fn incoming_staging(&self) -> (u64, u64) {
        let p = self.inner.incoming.lock();
        (p.created, p.reused)
    }

    /// Records a device-to-device copy of `len` bytes (4-byte aligned addresses).
    pub fn copy(&self, src: u64, dst: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let s = self.inner.alloc.resolve(src)?;
        let d = self.inner.alloc.resolve(dst)?;
        let padded = len.next_multiple_of(4);
        if padded > s.remaining || padded > d.remaining {
            return Err(Error::InvalidArgument(format!(
                "a copy of {len} bytes from {src:#x} to {dst:#x} runs past an allocation"
            )));
        }
        if !s.offset.is_multiple_of(4) || !d.offset.is_multiple_of(4) {
            return Err(Error::InvalidArgument(
                "device-to-device copies need 4-byte aligned addresses".into(),
            ));
        }
        self.inner.mirror.written(dst, padded);
        let ctx = KernelContext::new(&self.inner);
        crate::kernels::copy::copy_range(&ctx, &s.range(padded), &d.range(padded), padded)
    }

    /// Records a fill of `len` bytes at `addr` with a repeated 32-bit pattern.
    pub fn fill_u32(&self, addr: u64, len: u64, pattern: u32) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.inner.mirror.written(addr, len);
        if pattern == 0 && len.is_multiple_of(4) {
            let r = self.inner.alloc.resolve(addr)?;
            if len > r.remaining {
                return Err(Error::InvalidArgument(
                    "fill runs past its allocation".into(),
                ));
            }
            return self.inner.exec.clear(&r.buffer, r.offset, len);
        }
        crate::kernels::fill::fill_bytes(&KernelContext::new(&self.inner), addr, len, pattern)
    }

    /// Blocks until all work recorded so far has run.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.exec.synchronize()
    }

    /// Builds the kernel for `op` from `attrs` (done once per TensorFlow node).
    pub fn kernel(&self, op: &str, attrs: &Attrs) -> Result<Box<dyn crate::Kernel>> {
        Registry::global().build_kernel(op, attrs)
    }

    /// The output descs of `kernel` on `inputs` (`Kernel::outputs_on_device`: kernels with
    /// data-dependent output shapes may run GPU work and wait for it here).
    pub fn output_descs(
        &self,
        kernel: &dyn crate::Kernel,
        inputs: &[Operand],
    ) -> Result<Vec<crate::TensorDesc>> {
        let ctx = KernelContext::new(&self.inner);
        kernel.outputs_on_device(&ctx, inputs)
    }

    /// Records a kernel on already-allocated outputs.
    pub fn record(
        &self,
        kernel: &dyn crate::Kernel,
        inputs: &[Operand],
        outputs: &[DeviceRef],
    ) -> Result<()> {
        for o in outputs {
            self.inner.mirror.written(o.addr, o.desc.byte_size());
        }
        let ctx = KernelContext::new(&self.inner);
        kernel.record(&ctx, inputs, outputs)
    }

    // ---- tensor-level API ----

    /// Uploads typed host data as a new tensor.
    pub fn upload<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<Tensor> {
        let host = HostTensor::new(data, shape)?;
        self.upload_host(&host)
    }

    /// Uploads a host tensor.
    pub fn upload_host(&self, host: &HostTensor) -> Result<Tensor> {
        let t = self.empty(host.dtype, &host.shape)?;
        self.write(t.addr(), &host.bytes)?;
        Ok(t)
    }

    /// Allocates an uninitialized tensor.
    pub fn empty(&self, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let desc = TensorDesc::new(dtype, shape);
        let addr = self.allocate(desc.byte_size())?;
        Ok(Tensor {
            device: self.clone(),
            r: DeviceRef { desc, addr },
        })
    }

    /// Runs `op` on `args`: builds the kernel, allocates its outputs, records its work.
    pub fn run(&self, op: &str, attrs: &Attrs, args: &[Arg]) -> Result<Vec<Tensor>> {
        let kernel = self.kernel(op, attrs)?;
        self.run_kernel(kernel.as_ref(), args)
    }

    /// Runs a kernel built earlier.
    pub fn run_kernel(&self, kernel: &dyn crate::Kernel, args: &[Arg]) -> Result<Vec<Tensor>> {
        let operands: Vec<Operand> = args
            .iter()
            .map(|a| match a {
                Arg::Tensor(t) => Operand::Device(&t.r),
                Arg::Host(h) => Operand::Host(h),
            })
            .collect();
        for t in args.iter().filter_map(|a| match a {
            Arg::Tensor(t) => Some(t),
            _ => None,
        }) {
            if !Arc::ptr_eq(&t.device.inner, &self.inner) {
                return Err(Error::InvalidArgument(format!(
                    "{}: an input lives on another device",
                    kernel.op()
                )));
            }
        }
        let descs = self.output_descs(kernel, &operands)?;
        let outputs = descs
            .iter()
            .map(|d| self.empty(d.dtype, &d.shape))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<DeviceRef> = outputs.iter().map(|t| t.r.clone()).collect();
        self.record(kernel, &operands, &refs)?;
        Ok(outputs)
    }
}

/// An argument of `Device::run`.
#[derive(Clone, Copy)]
pub enum Arg<'a> {
    Tensor(&'a Tensor),
    Host(&'a HostTensor),
}

impl<'a> From<&'a Tensor> for Arg<'a> {
    fn from(t: &'a Tensor) -> Self {
        Arg::Tensor(t)
    }
}

impl<'a> From<&'a HostTensor> for Arg<'a> {
    fn from(h: &'a HostTensor) -> Self {
        Arg::Host(h)
    }
}

/// A read started by [`Device::read_async`]: the bytes are on their way to the host.
#[must_use = "a read in flight holds a staging buffer until it is finished"]
pub struct ReadInFlight {
    pending: PendingRead,
    len: usize,
    /// The bytes, when the host mirror had them (nothing in flight then).
    mirrored: Option<Vec<u8>>,
}

impl ReadInFlight {
    /// The batch whose completion makes the bytes available.
    pub fn batch(&self) -> u64 {
        self.pending.batch()
    }
}

/// A copy between two devices in flight (see [`Device::gated_write`]): its write is recorded
/// on the destination, whose later batches wait for [`IncomingCopy::land`]. Dropping it
/// without landing it poisons the destination (its held work is released, and its reads and
/// synchronizations report the failure): nothing waits forever.
#[must_use = "the destination device holds its later work until the copy lands"]
pub struct IncomingCopy {
    from: Device,
    to: Device,
    read: Option<ReadInFlight>,
    staging: Option<wgpu::Buffer>,
    /// The destination's batch holding the write (its gate).
    batch: u64,
    len: usize,
}

impl IncomingCopy {
    /// The source device's batch whose completion makes the bytes available (0: none).
    pub fn source_batch(&self) -> u64 {
        self.read.as_ref().map_or(0, |r| r.batch())
    }

    /// Bytes copied.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a copy of nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Waits for the source's bytes (polling the source for up to `spin` first, then
    /// blocking), puts them into the destination's staging buffer and lets the destination
    /// submit the work held behind it. A failed source read poisons the destination and is
    /// returned.
    pub fn land(mut self, spin: std::time::Duration) -> Result<()> {
        let (Some(read), Some(staging)) = (self.read.take(), self.staging.take()) else {
            return Ok(());
        };
        let batch = read.batch();
        let exec = self.from.exec();
        if batch > 0 && exec.completed() < batch && !spin.is_zero() {
            let t0 = std::time::Instant::now();
            while exec.completed() < batch && t0.elapsed() < spin {
                exec.poll_completions();
                std::hint::spin_loop();
            }
        }
        let len = self.len;
        let r = self
            .from
            .finish_read(read, |bytes| -> Result<()> {
                let mut view = staging
                    .slice(..)
                    .get_mapped_range_mut()
                    .map_err(|e| Error::Gpu(format!("mapping an incoming copy: {e}")))?;
                view.slice(..len.min(bytes.len()))
                    .copy_from_slice(&bytes[..len.min(bytes.len())]);
                Ok(())
            })
            .and_then(|r| r);
        staging.unmap();
        let failure = r.as_ref().err().map(|e| e.to_string());
        let opened = self.to.inner.exec.open_gate(self.batch, failure);
        if r.is_ok() && opened.is_ok() {
            self.to.inner.incoming.lock().give_back(staging, self.batch);
        }
        r.and(opened)
    }
}

impl Drop for IncomingCopy {
    fn drop(&mut self) {
        if let Some(staging) = self.staging.take() {
            staging.unmap();
            let _ = self.to.inner.exec.open_gate(
                self.batch,
                Some("the copy was dropped before its bytes landed".into()),
            );
        }
    }
}

/// A tensor in device memory, freed when dropped.
pub struct Tensor {
    device: Device,
    r: DeviceRef,
}

impl Tensor {
    pub fn dtype(&self) -> DType {
        self.r.desc.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.r.desc.shape
    }

    pub fn desc(&self) -> &TensorDesc {
        &self.r.desc
    }

    /// The device address.
    pub fn addr(&self) -> u64 {
        self.r.addr
    }

    /// The kernel-level view.
    pub fn device_ref(&self) -> &DeviceRef {
        &self.r
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Copies the data back to the host (blocks until it has been computed).
    pub fn download_host(&self) -> Result<HostTensor> {
        let bytes = self
            .device
            .read(self.r.addr, self.r.desc.byte_size() as usize)?;
        Ok(HostTensor {
            dtype: self.dtype(),
            shape: self.shape().to_vec(),
            bytes,
        })
    }

    /// Copies the data back as a typed vector.
    pub fn download<T: Element>(&self) -> Result<Vec<T>> {
        self.download_host()?.to_vec()
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        if let Err(e) = self.device.deallocate(self.r.addr) {
            tracing::error!("freeing a tensor: {e}");
        }
    }
}
