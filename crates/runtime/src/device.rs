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
    /// The address of the device's arrival counters (`KernelContext::arrival_counters`),
    /// once allocated.
    pub(crate) arrivals: parking_lot::Mutex<Option<u64>>,
    /// The adapter's tuner (`Tuner::of`, looked up once instead of on every kernel call).
    pub(crate) tuner: std::sync::OnceLock<Arc<crate::tune::Tuner>>,
    /// What the device offers for peer transfers (`RuntimeOptions::peer`, Vulkan only).
    peer: Option<crate::peer::PeerCaps>,
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
    /// Open Vulkan devices with the extensions for peer transfers where the adapter has them
    /// (`TFWGPU_PEER=1`; see `peer.rs`): host memory imported into several devices, sync-file
    /// semaphores between their queues.
    pub peer: bool,
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
            peer: crate::env_is("TFWGPU_PEER", "1"),
        })
    }
}

impl Runtime {
    /// Enumerates adapters and opens the ones `TFWGPU_VISIBLE_DEVICES` / `TFWGPU_ADAPTER`
    /// select (by default the best one of each physical GPU).
    pub fn new() -> Result<Runtime> {
        Runtime::with_options(RuntimeOptions::from_env()?)
    }

    /// The default adapter (as `new` picks it) opened twice, as two devices with their own
    /// queues and memory: how the multi-device paths are tested on a machine with one adapter.
    /// `adjust` sets the other options (they start from the environment's).
    pub fn default_adapter_twice(adjust: impl FnOnce(&mut RuntimeOptions)) -> Result<Runtime> {
        let index = Runtime::new()?.device().description().index;
        let mut opts = RuntimeOptions::from_env()?;
        opts.selection = Selection {
            visible: Some(vec![index, index]),
            name: None,
        };
        adjust(&mut opts);
        Runtime::with_options(opts)
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
        let mut opts = opts;
        if chosen.len() > 1 {
            // Several devices: the idle rule that session 6 measured on two GPUs
            // (`ExecConfig::idle_age_multi`).
            opts.exec.idle_age = opts.exec.idle_age_multi;
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

/// Host writes of at most this many bytes (`TFWGPU_WRITE_DISPATCH_BYTES`, at most
/// `fill::SMALL_WRITE_MAX`; default 0: off) are recorded as one dispatch that carries the bytes
/// in its params (`fill::write_small`) instead of a copy out of the uniform arena (which ends
/// the open compute pass) and, for lengths not a multiple of 4, a byte-masked fill of the tail.
/// Read once.
fn small_write_bytes() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        env_parse::<usize>("TFWGPU_WRITE_DISPATCH_BYTES")
            .unwrap_or(0)
            .min(crate::kernels::fill::SMALL_WRITE_MAX)
    })
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
        let device_desc = wgpu::DeviceDescriptor {
            label: Some("tfwgpu"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: experimental,
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        #[cfg(target_os = "linux")]
        let peer = if opts.peer {
            crate::peer::vk_impl::probe(adapter)
        } else {
            None
        };
        #[cfg(not(target_os = "linux"))]
        let peer: Option<crate::peer::PeerCaps> = None;
        if let Some(caps) = &peer {
            tracing::info!(
                "{}: peer transfers: host memory import {}, OPAQUE_FD timeline semaphores {}{}",
                desc.name,
                caps.host_memory,
                caps.timeline_fd,
                if caps.missing.is_empty() {
                    String::new()
                } else {
                    format!(" (missing: {})", caps.missing.join(", "))
                }
            );
        }
        let (device, queue) = match &peer {
            #[cfg(target_os = "linux")]
            Some(caps) if caps.host_memory || caps.timeline_fd => {
                crate::peer::vk_impl::open(adapter, caps, &device_desc)?
            }
            _ => pollster::block_on(adapter.request_device(&device_desc))
                .map_err(|e| Error::NoAdapter(format!("opening {}: {e}", desc.name)))?,
        };
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
        cfg.submit_thread.get_or_insert(desc.device_type != "cpu");
        let exec = ExecutionContext::new(device.clone(), queue, cfg);
        let inner = DeviceInner {
            arrivals: parking_lot::Mutex::new(None),
            tuner: std::sync::OnceLock::new(),
            peer,
            limits: device.limits(),
            features: device.features(),
            alloc: Allocator::new(device.clone(), index, limit),
            kernels: KernelManager::with_capacity(device.clone(), opts.kernel_cache_size),
            exec,
            desc,
            mirror: HostMirror::new(opts.host_mirror_bytes),
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
        if data.len() <= small_write_bytes() {
            // One dispatch carrying the bytes in its params (see `fill::write_small`).
            let _span = hostlog::HostSpan::start(Kind::WriteTail, data.len() as u64);
            crate::kernels::fill::write_small(&KernelContext::new(&self.inner), addr, data)?;
            self.inner.exec.count_upload();
            self.inner.mirror.wrote(addr, data);
            return Ok(());
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

    /// What the device offers for peer transfers (`None` unless opened with
    /// `RuntimeOptions::peer` on Vulkan).
    pub fn peer_caps(&self) -> Option<&crate::peer::PeerCaps> {
        self.inner.peer.as_ref()
    }

    /// Imports host memory shared with other devices as a buffer of this device (needs
    /// `peer_caps().host_memory`).
    pub fn import_host(
        &self,
        host: &Arc<crate::peer::HostShared>,
    ) -> Result<crate::peer::Imported> {
        match self.peer_caps() {
            #[cfg(target_os = "linux")]
            Some(c) if c.host_memory => {
                crate::peer::vk_impl::import_host(self.inner.exec.device(), host)
            }
            _ => Err(Error::Unimplemented(format!(
                "{}: no host memory import (open with TFWGPU_PEER=1 on Vulkan with \
                 VK_EXT_external_memory_host)",
                self.inner.desc.name
            ))),
        }
    }

    /// Records a copy of `len` bytes (a multiple of 4) from the allocation at `src` into
    /// `dst` (a buffer of this device, e.g. an imported one) at `dst_off`.
    pub fn copy_to_buffer(
        &self,
        src: u64,
        dst: &wgpu::Buffer,
        dst_off: u64,
        len: u64,
    ) -> Result<()> {
        let s = self.inner.alloc.resolve(src)?;
        if len > s.remaining || !len.is_multiple_of(4) || !s.offset.is_multiple_of(4) {
            return Err(Error::InvalidArgument(format!(
                "a copy of {len} bytes from {src:#x}: past its allocation or not 4-aligned"
            )));
        }
        self.inner.exec.copy(&s.buffer, s.offset, dst, dst_off, len)
    }

    /// Records a copy of `len` bytes (a multiple of 4) from `src` (a buffer of this device)
    /// at `src_off` into the allocation at `dst`.
    pub fn copy_from_buffer(
        &self,
        src: &wgpu::Buffer,
        src_off: u64,
        dst: u64,
        len: u64,
    ) -> Result<()> {
        let d = self.inner.alloc.resolve(dst)?;
        if len > d.remaining || !len.is_multiple_of(4) || !d.offset.is_multiple_of(4) {
            return Err(Error::InvalidArgument(format!(
                "a copy of {len} bytes to {dst:#x}: past its allocation or not 4-aligned"
            )));
        }
        self.inner.mirror.written(dst, len);
        self.inner.exec.copy(src, src_off, &d.buffer, d.offset, len)
    }

    /// A link from this device to `to` for GPU-side ordering (a timeline semaphore of this
    /// device exported once and imported permanently into `to`; needs `peer_caps().timeline_fd`
    /// on both). Drop it only after both devices synchronized.
    pub fn peer_link(&self, to: &Device) -> Result<crate::peer::PeerLink> {
        let ok = |d: &Device| d.peer_caps().is_some_and(|c| c.timeline_fd);
        match (ok(self), ok(to)) {
            #[cfg(target_os = "linux")]
            (true, true) => crate::peer::vk_impl::link(
                self.inner.exec.device(),
                to.inner.exec.device(),
                (self.id(), to.id()),
            ),
            _ => Err(Error::Unimplemented(format!(
                "{} -> {}: no OPAQUE_FD timeline semaphores (open with TFWGPU_PEER=1 on Vulkan \
                 with VK_KHR_external_semaphore_fd)",
                self.inner.desc.name, to.inner.desc.name
            ))),
        }
    }

    /// An identity of this opened device (two logical devices of one adapter differ).
    fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Submits the work recorded so far and returns, per link (each must start at this
    /// device), how its destination orders work after it: the link's next timeline value,
    /// signaled by that submit (staged for the batch's own submit; the host does not wait).
    /// The batch is encoded and submitted on the calling thread. Without
    /// links, one ticket: the batch id, which another device must wait for on the host
    /// ([`Device::wait_ticket`]). One thread at a time signals a given link (its values must
    /// reach the queue in increasing order).
    pub fn flush_signal(
        &self,
        links: &[&crate::peer::PeerLink],
    ) -> Result<Vec<crate::peer::Ticket>> {
        if links.is_empty() {
            return Ok(vec![crate::peer::Ticket::Batch(self.inner.exec.flush()?)]);
        }
        if let Some(l) = links.iter().find(|l| l.from != self.id()) {
            return Err(Error::InvalidArgument(format!(
                "{l:?} does not start at {}",
                self.inner.desc.name
            )));
        }
        #[cfg(target_os = "linux")]
        {
            use std::sync::atomic::Ordering;
            let raw: Vec<(ash::vk::Semaphore, u64)> = links
                .iter()
                .map(|l| (l.src.0, l.last.fetch_add(1, Ordering::SeqCst) + 1))
                .collect();
            let tickets = raw
                .iter()
                .map(|&(_, n)| crate::peer::Ticket::Value(n))
                .collect();
            let stage: crate::exec::BeforeSubmit = Box::new(move |q| {
                for (sem, n) in raw {
                    crate::peer::vk_impl::stage_signal(q, sem, n);
                }
            });
            self.inner.exec.flush_with(stage)?;
            Ok(tickets)
        }
        #[cfg(not(target_os = "linux"))]
        Err(Error::Unimplemented("peer links".into()))
    }

    /// Orders the work recorded on this device from now on after what `ticket` stands for on
    /// `from`: a timeline value of `link` (from `from` to this device) is waited for by this
    /// device's next submit (no host wait); a batch id is waited for on the host. Returns
    /// whether the host waited.
    pub fn wait_ticket(
        &self,
        from: &Device,
        link: Option<&crate::peer::PeerLink>,
        ticket: crate::peer::Ticket,
    ) -> Result<bool> {
        match (ticket, link) {
            (crate::peer::Ticket::Batch(id), _) => {
                from.exec().wait(id)?;
                Ok(true)
            }
            #[cfg(target_os = "linux")]
            (crate::peer::Ticket::Value(v), Some(l))
                if l.from == from.id() && l.to == self.id() =>
            {
                crate::peer::vk_impl::stage_wait(self.inner.exec.queue(), l, v)?;
                Ok(false)
            }
            (t, l) => Err(Error::InvalidArgument(format!(
                "{t:?} on {}: needs the link from its source to this device (got {l:?})",
                self.inner.desc.name
            ))),
        }
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

    /// Runs `f` with a recording context of this device (unit tests of recording helpers).
    #[cfg(test)]
    pub(crate) fn with_context<R>(&self, f: impl FnOnce(&KernelContext) -> R) -> R {
        f(&KernelContext::new(&self.inner))
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
