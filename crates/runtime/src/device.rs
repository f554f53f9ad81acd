//! Device (one adapter + device + queue), the Runtime (all selected devices), and Tensor.

use std::sync::Arc;

use crate::adapter::{AdapterDescription, Selection, enumerate, new_instance, useful_feature_list};
use crate::allocator::{Allocator, AllocatorStats};
use crate::exec::{ExecConfig, ExecStats, ExecutionContext, PendingRead, env_parse};
use crate::hostlog::{self, Kind};
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
    /// Copies from other devices whose write is not recorded yet, in issue order (see
    /// `Device::gated_write`), and their number, readable without the lock.
    pending: parking_lot::Mutex<Vec<Pending>>,
    pending_count: std::sync::atomic::AtomicUsize,
    /// The address of the device's arrival counters (`KernelContext::arrival_counters`),
    /// once allocated.
    pub(crate) arrivals: parking_lot::Mutex<Option<u64>>,
}

/// A copy from another device registered on this one (see [`Device::gated_write`]).
struct Pending {
    addr: u64,
    /// Bytes written (the copy's length rounded up to whole words).
    len: u64,
    state: Arc<parking_lot::Mutex<Incoming>>,
}

/// Where a copy from another device stands on its destination.
enum Incoming {
    /// Nothing recorded yet: the first work here that touches the range records the write
    /// behind a gate; if the bytes land first, they are written as an ordinary upload.
    Waiting,
    /// Recorded behind the gate of batch `batch`, from `staging` (mapped, not yet filled).
    Gated { staging: wgpu::Buffer, batch: u64 },
    /// Landed or failed.
    Done,
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
            pending: parking_lot::Mutex::new(Vec::new()),
            pending_count: std::sync::atomic::AtomicUsize::new(0),
            arrivals: parking_lot::Mutex::new(None),
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
        if self.pending_incoming() > 0
            && let Ok(r) = self.inner.alloc.resolve(addr)
        {
            // A copy from another device still pending in the allocation is recorded first,
            // so that the memory is reused only after it ran.
            self.touch(addr, r.remaining)?;
        }
        self.inner.alloc.free(addr, self.inner.exec.tag())
    }

    /// Records a host-to-device copy to `addr`; returns without waiting for the GPU.
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let t0 = hostlog::now();
        self.touch(addr, data.len() as u64)?;
        hostlog::span(Kind::WriteTouch, t0, 0);
        self.write_untouched(addr, data)
    }

    /// [`Device::write`] without looking for copies from other devices pending there.
    fn write_untouched(&self, addr: u64, data: &[u8]) -> Result<()> {
        let t0 = hostlog::now();
        let r = self.inner.alloc.resolve(addr)?;
        hostlog::span(Kind::WriteResolve, t0, 0);
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
        let _tail_span = hostlog::HostSpan::start(Kind::WriteTail, (data.len() - full) as u64);
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
        self.touch(addr, dst.len() as u64)?;
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
        self.touch(addr, len as u64)?;
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

    /// Registers on this device the write at `dst` of the bytes that `read` (a read started
    /// on device `from`) brings back, and returns at once: a copy between two devices, ordered
    /// on the GPU side instead of on the host. [`IncomingCopy::land`] (a copier thread) puts
    /// the bytes in place later.
    ///
    /// The write is recorded lazily, where this device's order needs it: the first work
    /// recorded here that touches the range (a kernel reading or writing it, a copy, a fill, a
    /// host write or read, a synchronization) first records the write, from a staging buffer
    /// the copier fills later, behind a *gate*: that batch and every later one are held back
    /// from this device's queue until the bytes are in the staging buffer (see
    /// `ExecutionContext::record_gated_copy`); the host records on. If the bytes land before
    /// anything touched the range, they are written as an ordinary upload and nothing is held.
    /// Work recorded here that does not touch the range (another replica's backward pass, a
    /// read for a copy the other way) is never held behind the copy. The source side is
    /// `read`: recorded and submitted on `from` when it was started, in `from`'s order.
    ///
    /// Deadlock freedom: a read is held only behind gates registered before it was started,
    /// and a gate opens when its own read (started before the copy was registered, so before
    /// the gate) has landed; so a chain of waits goes back in time and ends, provided whoever
    /// lands the copies does so in the order they were registered (one thread per device that
    /// issues copies, fed in that order, does).
    ///
    /// A copy whose length is not a multiple of 4 writes whole words: the 1-3 bytes after it
    /// in its last word get the source's (TensorFlow's tensors are 256-byte aligned, so these
    /// are the padding of the same tensor).
    pub fn gated_write(&self, dst: u64, from: &Device, read: ReadInFlight) -> Result<IncomingCopy> {
        let len = read.len;
        let mut copy = IncomingCopy {
            from: from.clone(),
            to: self.clone(),
            read: None,
            state: None,
            dst,
            len,
        };
        if len == 0 {
            return Ok(copy);
        }
        if let Some(bytes) = &read.mirrored {
            // The source's host mirror had the bytes: nothing to wait for.
            self.write(dst, bytes)?;
            return Ok(copy);
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
        // An earlier copy still pending in the range is recorded first (writes stay in order).
        self.touch(dst, padded)?;
        self.inner.mirror.written(dst, padded);
        let state = Arc::new(parking_lot::Mutex::new(Incoming::Waiting));
        {
            let mut list = self.inner.pending.lock();
            list.push(Pending {
                addr: dst,
                len: padded,
                state: state.clone(),
            });
            self.inner
                .pending_count
                .store(list.len(), std::sync::atomic::Ordering::Release);
        }
        copy.read = Some(read);
        copy.state = Some(state);
        Ok(copy)
    }

    /// Records, behind gates, the writes of copies from other devices pending in
    /// `[addr, addr + len)`, in the order they were issued: work about to touch the range
    /// comes after them.
    fn touch(&self, addr: u64, len: u64) -> Result<()> {
        if self
            .inner
            .pending_count
            .load(std::sync::atomic::Ordering::Acquire)
            == 0
        {
            return Ok(());
        }
        let mut list = self.inner.pending.lock();
        let end = addr.saturating_add(len.max(1));
        let mut result = Ok(());
        let mut i = 0;
        while i < list.len() {
            let p = &list[i];
            if p.addr < end && addr < p.addr + p.len {
                let p = list.remove(i);
                let r = self.gate(&p);
                if result.is_ok() {
                    result = r;
                }
            } else {
                i += 1;
            }
        }
        self.inner
            .pending_count
            .store(list.len(), std::sync::atomic::Ordering::Release);
        result
    }

    /// [`Device::touch`] for a kernel's device inputs and its outputs.
    fn touch_operands(&self, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        if self
            .inner
            .pending_count
            .load(std::sync::atomic::Ordering::Acquire)
            == 0
        {
            return Ok(());
        }
        for i in inputs {
            if let Operand::Device(r) = i {
                self.touch(r.addr, r.desc.byte_size())?;
            }
        }
        for o in outputs {
            self.touch(o.addr, o.desc.byte_size())?;
        }
        Ok(())
    }

    /// Records a pending copy's write behind a gate (the caller holds the pending list).
    fn gate(&self, p: &Pending) -> Result<()> {
        let mut st = p.state.lock();
        if !matches!(*st, Incoming::Waiting) {
            return Ok(());
        }
        let r = self.inner.alloc.resolve(p.addr)?;
        let class = StagingPool::class(p.len);
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
        let batch = self
            .inner
            .exec
            .record_gated_copy(&staging, &r.buffer, r.offset, p.len)?;
        *st = Incoming::Gated { staging, batch };
        Ok(())
    }

    /// Copies from other devices registered here whose bytes have not landed and that nothing
    /// has touched yet (their writes are not recorded).
    pub fn pending_incoming(&self) -> usize {
        self.inner
            .pending_count
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// A copy registered here failed (its source read failed, or it was dropped unlanded):
    /// its gate opens with the failure, or, if its write was not recorded, the device is
    /// poisoned directly. Nothing waits for it forever.
    fn fail_incoming(&self, state: &Arc<parking_lot::Mutex<Incoming>>, msg: String) {
        let mut list = self.inner.pending.lock();
        list.retain(|p| !Arc::ptr_eq(&p.state, state));
        self.inner
            .pending_count
            .store(list.len(), std::sync::atomic::Ordering::Release);
        let was = std::mem::replace(&mut *state.lock(), Incoming::Done);
        drop(list);
        match was {
            Incoming::Waiting => self.inner.exec.poison(msg),
            Incoming::Gated { staging, batch } => {
                staging.unmap();
                let _ = self.inner.exec.open_gate(batch, Some(msg));
            }
            Incoming::Done => {}
        }
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
        self.touch(src, padded)?;
        self.touch(dst, padded)?;
        self.inner.mirror.written(dst, padded);
        let ctx = KernelContext::new(&self.inner);
        crate::kernels::copy::copy_range(&ctx, &s.range(padded), &d.range(padded), padded)
    }

    /// Records a fill of `len` bytes at `addr` with a repeated 32-bit pattern.
    pub fn fill_u32(&self, addr: u64, len: u64, pattern: u32) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.touch(addr, len)?;
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

    /// Blocks until all work recorded so far has run, copies from other devices pending
    /// here included (they are recorded first).
    pub fn synchronize(&self) -> Result<()> {
        self.touch(0, u64::MAX)?;
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
        self.touch_operands(inputs, &[])?;
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
        self.touch_operands(inputs, outputs)?;
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

/// A copy between two devices in flight (see [`Device::gated_write`]): registered on the
/// destination, whose work that touches its range waits (on the GPU side) for
/// [`IncomingCopy::land`]. Dropping it without landing it poisons the destination (held work
/// is released, and its reads and synchronizations report the failure): nothing waits
/// forever.
#[must_use = "the destination's work on the range waits until the copy lands"]
pub struct IncomingCopy {
    from: Device,
    to: Device,
    read: Option<ReadInFlight>,
    state: Option<Arc<parking_lot::Mutex<Incoming>>>,
    dst: u64,
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
    /// blocking), and puts them in place: into the staging buffer of the write recorded
    /// behind a gate (and lets the destination submit the work held behind it), or, if
    /// nothing touched the range yet, as an ordinary upload. A failed source read poisons the
    /// destination and is returned.
    pub fn land(mut self, spin: std::time::Duration) -> Result<()> {
        let (Some(read), Some(state)) = (self.read.take(), self.state.take()) else {
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
        let (to, dst, len) = (&self.to, self.dst, self.len);
        let mut opened: Option<(wgpu::Buffer, u64)> = None;
        let r = self
            .from
            .finish_read(read, |bytes| -> Result<()> {
                let bytes = &bytes[..len.min(bytes.len())];
                // The pending list first, as `touch` takes them: no toucher is halfway.
                let mut list = to.inner.pending.lock();
                let mut st = state.lock();
                match std::mem::replace(&mut *st, Incoming::Done) {
                    Incoming::Waiting => {
                        // Nothing touched the range: an ordinary upload, recorded before the
                        // entry leaves the list (a thread that finds the list empty skips the
                        // lock: its work must come after the upload).
                        let written = to.write_untouched(dst, bytes);
                        list.retain(|p| !Arc::ptr_eq(&p.state, &state));
                        to.inner
                            .pending_count
                            .store(list.len(), std::sync::atomic::Ordering::Release);
                        written
                    }
                    Incoming::Gated { staging, batch } => {
                        drop(list);
                        let filled = staging
                            .slice(..)
                            .get_mapped_range_mut()
                            .map(|mut view| view.slice(..bytes.len()).copy_from_slice(bytes))
                            .map_err(|e| Error::Gpu(format!("mapping an incoming copy: {e}")));
                        staging.unmap();
                        opened = Some((staging, batch));
                        filled
                    }
                    Incoming::Done => Ok(()),
                }
            })
            .and_then(|r| r);
        match (opened, &r) {
            (Some((staging, batch)), Ok(())) => {
                let o = to.inner.exec.open_gate(batch, None);
                if o.is_ok() {
                    to.inner.incoming.lock().give_back(staging, batch);
                }
                o
            }
            (Some((_, batch)), Err(e)) => {
                let _ = to.inner.exec.open_gate(batch, Some(e.to_string()));
                r
            }
            (None, Err(e)) => {
                to.fail_incoming(&state, e.to_string());
                r
            }
            (None, Ok(())) => r,
        }
    }
}

impl Drop for IncomingCopy {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            self.to.fail_incoming(
                &state,
                "the copy was dropped before its bytes landed".into(),
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
