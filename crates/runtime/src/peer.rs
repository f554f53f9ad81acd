//! Device-to-device transfers without the host in the loop (Vulkan on Linux only; opt-in with
//! `TFWGPU_PEER=1`, see [`crate::RuntimeOptions::peer`]).
//!
//! wgpu 30 has no cross-device path; its Vulkan HAL lets the runtime add one:
//! - **memory both devices reach**: host memory imported into each device with
//!   `VK_EXT_external_memory_host` ([`HostShared`], [`Device::import_host`]): one device's
//!   queue copies bytes into it, the other's copies them out, and no CPU touches them;
//! - **ordering without a host wait**: a [`PeerLink`] from a source device to a destination is
//!   one timeline semaphore created on the source, exported once as an `OPAQUE_FD`
//!   (`VK_KHR_external_semaphore_fd`) and imported permanently into a timeline semaphore of the
//!   destination ([`Device::peer_link`]). The source's batch that holds the copies signals the
//!   link's next value ([`Device::flush_signal`]: staged on wgpu-hal's queue for that batch's own
//!   submit); the destination's next submit waits for that value ([`Device::wait_ticket`]). The
//!   host only passes a number along and never waits for a GPU. (The spec allows `OPAQUE_FD`
//!   sharing only between devices of one `deviceUUID`; the NVIDIA driver orders two H200s through
//!   it: `tfwgpu-bench vkprobe --pair`, bench/RESULTS.md session 12.)
//!
//! Where a device offers the memory import but not these semaphores, [`Device::flush_signal`]
//! returns the batch id instead and the destination waits for it on the host
//! ([`Ticket::Batch`]): the caller counts and reports that fallback.
//!
//! What is not done: no queue-family ownership transfer to/from `VK_QUEUE_FAMILY_EXTERNAL`
//! (wgpu records no such barriers); the imported buffers are only ever copied from or into,
//! which host-coherent memory on the drivers probed keeps correct, but the spec asks for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Error, Result};

/// What a device offers for peer transfers (probed at open; `None` on a device opened without
/// `TFWGPU_PEER=1` or off Vulkan).
#[derive(Clone, Debug, Default)]
pub struct PeerCaps {
    /// `VK_EXT_external_memory_host` is enabled: host memory can be imported.
    pub host_memory: bool,
    /// `minImportedHostPointerAlignment` (bytes): imported pointers and sizes are multiples.
    pub host_align: u64,
    /// `VK_KHR_external_semaphore_fd` is enabled and timeline semaphores export and import
    /// `OPAQUE_FD` handles ([`PeerLink`]).
    pub timeline_fd: bool,
    /// Why something above is missing, for the log and the reports.
    pub missing: Vec<String>,
}

/// Host memory, page-aligned, zero-filled, imported by one or more devices. Freed when the
/// last import of it is gone.
pub struct HostShared {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: the memory is only touched through device copies that the caller orders; the struct
// only owns the allocation.
unsafe impl Send for HostShared {}
unsafe impl Sync for HostShared {}

impl HostShared {
    /// `size` bytes (rounded up to `align`), aligned to `align` (a power of two, at least 4096).
    pub fn new(size: u64, align: u64) -> Result<Arc<HostShared>> {
        let align = align.max(4096);
        let size = size.max(1).next_multiple_of(align);
        let layout = std::alloc::Layout::from_size_align(size as usize, align as usize)
            .map_err(|e| Error::InvalidArgument(format!("host memory of {size} bytes: {e}")))?;
        // SAFETY: the layout has a nonzero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(ptr)
            .ok_or_else(|| Error::OutOfMemory(format!("{size} bytes of host memory")))?;
        Ok(Arc::new(HostShared { ptr, layout }))
    }

    /// Bytes (a multiple of the alignment).
    pub fn size(&self) -> u64 {
        self.layout.size() as u64
    }

    /// The bytes as they are now: only meaningful once every device copy into them completed.
    pub fn snapshot(&self, offset: u64, len: u64) -> Vec<u8> {
        assert!(offset + len <= self.size());
        // SAFETY: in bounds; the caller ordered the device writes before this read.
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr().add(offset as usize), len as usize)
                .to_vec()
        }
    }
}

impl Drop for HostShared {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A [`HostShared`] imported into one device: a wgpu buffer over all of it (copy source and
/// destination). Dropping it releases the Vulkan buffer and memory once wgpu is done with it.
pub struct Imported {
    pub buffer: wgpu::Buffer,
    pub host: Arc<HostShared>,
}

/// A timeline semaphore shared by a source device and a destination (one direction): created
/// on the source, exported as an `OPAQUE_FD` and imported permanently into a semaphore of the
/// destination. The source's submits signal increasing values, the destination's submits wait
/// for them. Drop it only after both devices synchronized.
pub struct PeerLink {
    /// The source and destination devices' adapter indices and names (for misuse checks).
    pub(crate) from: usize,
    pub(crate) to: usize,
    /// The last value a submit of the source was given to signal (0: none yet).
    pub(crate) last: Arc<std::sync::atomic::AtomicU64>,
    #[cfg(target_os = "linux")]
    pub(crate) src: (ash::vk::Semaphore, ash::Device),
    #[cfg(target_os = "linux")]
    pub(crate) dst: (ash::vk::Semaphore, ash::Device),
}

impl PeerLink {
    /// The last value staged for a source submit to signal.
    pub fn last_value(&self) -> u64 {
        self.last.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for PeerLink {
    fn drop(&mut self) {
        // SAFETY: the owner drops it only once no submit that signals or waits on it is pending
        // (after both devices synchronized).
        #[cfg(target_os = "linux")]
        unsafe {
            self.dst.1.destroy_semaphore(self.dst.0, None);
            self.src.1.destroy_semaphore(self.src.0, None);
        }
    }
}

impl std::fmt::Debug for PeerLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PeerLink({} -> {}, last {})",
            self.from,
            self.to,
            self.last_value()
        )
    }
}

/// How a destination learns that a source's copy is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ticket {
    /// The value of a [`PeerLink`]'s timeline the source's submit signals (GPU-ordered).
    Value(u64),
    /// Fallback: the source's batch id, for a host wait on the source device.
    Batch(u64),
}

#[cfg(target_os = "linux")]
pub(crate) mod vk_impl {
    use super::*;
    use ash::vk;

    pub(crate) const HOST_EXT: &std::ffi::CStr = ash::ext::external_memory_host::NAME;
    pub(crate) const SEM_FD_EXT: &std::ffi::CStr = ash::khr::external_semaphore_fd::NAME;

    /// Which peer extensions and handle types the adapter offers (nothing is created).
    pub(crate) fn probe(adapter: &wgpu::Adapter) -> Option<PeerCaps> {
        // SAFETY: only queries of the physical device through wgpu-hal's live instance.
        unsafe {
            let hal = adapter.as_hal::<wgpu::hal::api::Vulkan>()?;
            let instance = hal.shared_instance().raw_instance();
            let phys = hal.raw_physical_device();
            let mut caps = PeerCaps::default();
            let props = instance.get_physical_device_properties(phys);
            if props.api_version < vk::API_VERSION_1_1 {
                caps.missing.push("Vulkan 1.1".into());
                return Some(caps);
            }
            let exts = instance
                .enumerate_device_extension_properties(phys)
                .unwrap_or_default();
            let has = |name: &std::ffi::CStr| {
                exts.iter()
                    .any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == name))
            };
            if has(HOST_EXT) {
                let mut host = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
                let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut host);
                instance.get_physical_device_properties2(phys, &mut p2);
                caps.host_align = host.min_imported_host_pointer_alignment;
                let info = vk::PhysicalDeviceExternalBufferInfo::default()
                    .usage(
                        vk::BufferUsageFlags::TRANSFER_SRC
                            | vk::BufferUsageFlags::TRANSFER_DST
                            | vk::BufferUsageFlags::STORAGE_BUFFER,
                    )
                    .handle_type(vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT);
                let mut ext = vk::ExternalBufferProperties::default();
                instance.get_physical_device_external_buffer_properties(phys, &info, &mut ext);
                if ext
                    .external_memory_properties
                    .external_memory_features
                    .contains(vk::ExternalMemoryFeatureFlags::IMPORTABLE)
                {
                    caps.host_memory = true;
                } else {
                    caps.missing
                        .push("host-allocation buffers are not importable".into());
                }
            } else {
                caps.missing.push(format!("{HOST_EXT:?}"));
            }
            if has(SEM_FD_EXT) {
                let mut ty = vk::SemaphoreTypeCreateInfo::default()
                    .semaphore_type(vk::SemaphoreType::TIMELINE)
                    .initial_value(0);
                let info = vk::PhysicalDeviceExternalSemaphoreInfo::default()
                    .handle_type(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD)
                    .push_next(&mut ty);
                let mut ext = vk::ExternalSemaphoreProperties::default();
                instance.get_physical_device_external_semaphore_properties(phys, &info, &mut ext);
                let need = vk::ExternalSemaphoreFeatureFlags::EXPORTABLE
                    | vk::ExternalSemaphoreFeatureFlags::IMPORTABLE;
                let mut tl = vk::PhysicalDeviceTimelineSemaphoreFeatures::default();
                let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut tl);
                instance.get_physical_device_features2(phys, &mut f2);
                if tl.timeline_semaphore != vk::TRUE || props.api_version < vk::API_VERSION_1_2 {
                    caps.missing.push("timeline semaphores (Vulkan 1.2)".into());
                } else if ext.external_semaphore_features.contains(need) {
                    caps.timeline_fd = true;
                } else {
                    caps.missing.push(format!(
                        "OPAQUE_FD timeline semaphores: features {:?}",
                        ext.external_semaphore_features
                    ));
                }
            } else {
                caps.missing.push(format!("{SEM_FD_EXT:?}"));
            }
            Some(caps)
        }
    }

    /// Every device extension of a Vulkan adapter, by name (for reports).
    pub(crate) fn extensions(adapter: &wgpu::Adapter) -> Vec<String> {
        // SAFETY: a query of the physical device.
        unsafe {
            let Some(hal) = adapter.as_hal::<wgpu::hal::api::Vulkan>() else {
                return vec![];
            };
            let instance = hal.shared_instance().raw_instance();
            instance
                .enumerate_device_extension_properties(hal.raw_physical_device())
                .unwrap_or_default()
                .iter()
                .filter_map(|e| {
                    e.extension_name_as_c_str()
                        .ok()
                        .map(|n| n.to_string_lossy().into_owned())
                })
                .collect()
        }
    }

    /// Opens `adapter` through wgpu-hal with the extensions `caps` says it has added.
    pub(crate) fn open(
        adapter: &wgpu::Adapter,
        caps: &PeerCaps,
        desc: &wgpu::DeviceDescriptor<'_>,
    ) -> Result<(wgpu::Device, wgpu::Queue)> {
        let mut add: Vec<&'static std::ffi::CStr> = vec![];
        if caps.host_memory {
            add.push(HOST_EXT);
        }
        if caps.timeline_fd {
            add.push(SEM_FD_EXT);
        }
        let open = {
            // SAFETY: the callback only adds extensions the adapter reports (probed).
            let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }
                .ok_or_else(|| Error::NoAdapter("not a Vulkan adapter".into()))?;
            unsafe {
                hal.open_with_callback(
                    desc.required_features,
                    &desc.required_limits,
                    &desc.memory_hints,
                    Some(Box::new(move |args| {
                        for e in add {
                            if !args.extensions.contains(&e) {
                                args.extensions.push(e);
                            }
                        }
                    })),
                )
            }
            .map_err(|e| Error::NoAdapter(format!("opening with peer extensions: {e}")))?
        };
        // SAFETY: `open` comes from this adapter's hal, with the features and limits of `desc`.
        unsafe { adapter.create_device_from_hal(open, desc) }
            .map_err(|e| Error::NoAdapter(format!("opening with peer extensions: {e}")))
    }

    fn raw(device: &wgpu::Device) -> Result<(ash::Instance, ash::Device, vk::PhysicalDevice)> {
        // SAFETY: clones of function tables and handles that live as long as the device.
        unsafe {
            let hal = device
                .as_hal::<wgpu::hal::api::Vulkan>()
                .ok_or_else(|| Error::Gpu("not a Vulkan device".into()))?;
            Ok((
                hal.shared_instance().raw_instance().clone(),
                hal.raw_device().clone(),
                hal.raw_physical_device(),
            ))
        }
    }

    fn vkerr(what: &str) -> impl Fn(vk::Result) -> Error + '_ {
        move |e| Error::Gpu(format!("{what}: {e}"))
    }

    pub(crate) fn import_host(device: &wgpu::Device, host: &Arc<HostShared>) -> Result<Imported> {
        let (instance, dev, phys) = raw(device)?;
        let ext = ash::ext::external_memory_host::Device::new(&instance, &dev);
        let size = host.size();
        let ptr = host.ptr.as_ptr().cast::<std::ffi::c_void>();
        let handle = vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;
        // SAFETY: `ptr` covers `size` bytes aligned as the probe asked; every object created
        // here is destroyed on error or by the buffer's drop callback.
        unsafe {
            let mut hp = vk::MemoryHostPointerPropertiesEXT::default();
            (ext.fp().get_memory_host_pointer_properties_ext)(dev.handle(), handle, ptr, &mut hp)
                .result()
                .map_err(vkerr("vkGetMemoryHostPointerPropertiesEXT"))?;
            let mut ext_info = vk::ExternalMemoryBufferCreateInfo::default().handle_types(handle);
            let info = vk::BufferCreateInfo::default()
                .size(size)
                .usage(
                    vk::BufferUsageFlags::TRANSFER_SRC
                        | vk::BufferUsageFlags::TRANSFER_DST
                        | vk::BufferUsageFlags::STORAGE_BUFFER,
                )
                .sharing_mode(vk::SharingMode::EXCLUSIVE)
                .push_next(&mut ext_info);
            let buffer = dev
                .create_buffer(&info, None)
                .map_err(vkerr("vkCreateBuffer (host import)"))?;
            let req = dev.get_buffer_memory_requirements(buffer);
            let types = instance.get_physical_device_memory_properties(phys);
            let bits = hp.memory_type_bits & req.memory_type_bits;
            let pick = (0..types.memory_type_count).filter(|&i| bits & (1 << i) != 0);
            let coherent = vk::MemoryPropertyFlags::HOST_COHERENT;
            let ty = pick
                .clone()
                .find(|&i| {
                    types.memory_types[i as usize]
                        .property_flags
                        .contains(coherent)
                })
                .or_else(|| pick.clone().next());
            let Some(ty) = ty else {
                dev.destroy_buffer(buffer, None);
                return Err(Error::Gpu(format!(
                    "no memory type can import host memory (pointer bits {:#x}, buffer bits {:#x})",
                    hp.memory_type_bits, req.memory_type_bits
                )));
            };
            let mut import = vk::ImportMemoryHostPointerInfoEXT::default()
                .handle_type(handle)
                .host_pointer(ptr);
            let alloc = vk::MemoryAllocateInfo::default()
                .allocation_size(size)
                .memory_type_index(ty)
                .push_next(&mut import);
            let memory = match dev.allocate_memory(&alloc, None) {
                Ok(m) => m,
                Err(e) => {
                    dev.destroy_buffer(buffer, None);
                    return Err(vkerr("vkAllocateMemory (host import)")(e));
                }
            };
            if let Err(e) = dev.bind_buffer_memory(buffer, memory, 0) {
                dev.destroy_buffer(buffer, None);
                dev.free_memory(memory, None);
                return Err(vkerr("vkBindBufferMemory (host import)")(e));
            }
            let keep = host.clone();
            let d2 = dev.clone();
            let hal_buffer = wgpu::hal::vulkan::Buffer::from_raw_externally_owned(
                buffer,
                Box::new(move || {
                    d2.destroy_buffer(buffer, None);
                    d2.free_memory(memory, None);
                    drop(keep);
                }),
            );
            // wgpu-core treats a buffer made from hal as initialized (no lazy zero-fill): what
            // another device wrote into the host memory is never cleared by this device's uses.
            let wbuf = device.create_buffer_from_hal::<wgpu::hal::api::Vulkan>(
                hal_buffer,
                &wgpu::BufferDescriptor {
                    label: Some("tfwgpu peer host memory"),
                    size,
                    usage: wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST
                        | wgpu::BufferUsages::STORAGE,
                    mapped_at_creation: false,
                },
            );
            Ok(Imported {
                buffer: wbuf,
                host: host.clone(),
            })
        }
    }

    fn timeline(dev: &ash::Device, export: bool) -> Result<vk::Semaphore> {
        let mut ty = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let mut ex = vk::ExportSemaphoreCreateInfo::default()
            .handle_types(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD);
        let mut info = vk::SemaphoreCreateInfo::default().push_next(&mut ty);
        if export {
            info = info.push_next(&mut ex);
        }
        // SAFETY: a timeline semaphore, destroyed by its owner (`PeerLink`) or on error.
        unsafe { dev.create_semaphore(&info, None) }.map_err(vkerr("vkCreateSemaphore (timeline)"))
    }

    /// A timeline semaphore of `from`, exported as an `OPAQUE_FD` and imported permanently
    /// into a timeline semaphore of `to` (the import takes the descriptor).
    pub(crate) fn link(
        from: &wgpu::Device,
        to: &wgpu::Device,
        ids: (usize, usize),
    ) -> Result<PeerLink> {
        let (inst_a, dev_a, _) = raw(from)?;
        let (inst_b, dev_b, _) = raw(to)?;
        let src = timeline(&dev_a, true)?;
        let dst = match timeline(&dev_b, false) {
            Ok(d) => d,
            Err(e) => {
                // SAFETY: nothing uses it yet.
                unsafe { dev_a.destroy_semaphore(src, None) };
                return Err(e);
            }
        };
        // From here on the link owns both semaphores (dropped on error).
        let link = PeerLink {
            from: ids.0,
            to: ids.1,
            last: Arc::default(),
            src: (src, dev_a.clone()),
            dst: (dst, dev_b.clone()),
        };
        let ext_a = ash::khr::external_semaphore_fd::Device::new(&inst_a, &dev_a);
        let ext_b = ash::khr::external_semaphore_fd::Device::new(&inst_b, &dev_b);
        let get = vk::SemaphoreGetFdInfoKHR::default()
            .semaphore(src)
            .handle_type(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD);
        // SAFETY: an exportable semaphore of `from`.
        let fd = unsafe { ext_a.get_semaphore_fd(&get) }
            .map_err(vkerr("vkGetSemaphoreFdKHR (OPAQUE_FD)"))?;
        let import = vk::ImportSemaphoreFdInfoKHR::default()
            .semaphore(dst)
            .handle_type(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD)
            .fd(fd);
        // SAFETY: `dst` has no pending operation; on success Vulkan owns `fd`.
        if let Err(e) = unsafe { ext_b.import_semaphore_fd(&import) } {
            use std::os::fd::{FromRawFd, OwnedFd};
            // SAFETY: the failed import left the descriptor to us.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
            return Err(vkerr("vkImportSemaphoreFdKHR (OPAQUE_FD, permanent)")(e));
        }
        Ok(link)
    }

    /// Stages `value` of a link's timeline (`sem`, the source's side) to be signaled by the queue's next submit (the
    /// caller makes that submit the one it means, under the runtime's submit order).
    pub(crate) fn stage_signal(queue: &wgpu::Queue, sem: vk::Semaphore, value: u64) {
        // SAFETY: the semaphore lives until both devices synchronized after its use.
        unsafe {
            if let Some(q) = queue.as_hal::<wgpu::hal::api::Vulkan>() {
                q.add_signal_semaphore(sem, Some(value));
            }
        }
    }

    /// Stages a wait for `value` of the link's timeline (imported side) on the queue's next
    /// submit (all commands wait).
    pub(crate) fn stage_wait(queue: &wgpu::Queue, link: &PeerLink, value: u64) -> Result<()> {
        // SAFETY: the semaphore lives until both devices synchronized after its use.
        unsafe {
            let q = queue
                .as_hal::<wgpu::hal::api::Vulkan>()
                .ok_or_else(|| Error::Gpu("not a Vulkan queue".into()))?;
            q.add_wait_semaphore(
                link.dst.0,
                Some(value),
                vk::PipelineStageFlags::ALL_COMMANDS,
            );
        }
        Ok(())
    }
}

/// Per adapter the runtime enumerates: its description, what it offers for peer transfers
/// (`None` off Vulkan), and every device extension it reports (for reports).
pub fn probe_adapters() -> Vec<(crate::AdapterDescription, Option<PeerCaps>, Vec<String>)> {
    let instance = crate::adapter::new_instance();
    crate::adapter::enumerate(&instance)
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let d = crate::AdapterDescription::from_adapter(i, a);
            #[cfg(target_os = "linux")]
            let (caps, exts) = (vk_impl::probe(a), vk_impl::extensions(a));
            #[cfg(not(target_os = "linux"))]
            let (caps, exts) = (None, vec![]);
            (d, caps, exts)
        })
        .collect()
}

/// Copies from one device to another through a ring of host memory that both import, with no
/// host copy: the source's queue copies a tensor's bytes into the ring, the destination's queue
/// copies them out, after them. Where both devices have `OPAQUE_FD` timeline semaphores the
/// order is kept on the GPUs ([`PeerLink`]: the host returns at once, and the destination's
/// queue waits for the source's submit); elsewhere the host waits for the source's batch
/// before recording the destination's copy (counted: [`Route::host_waits`]).
///
/// A ring region is reused once the destination's batch that read it completed (the host waits
/// for it then, counted in [`Route::ring_waits`]). Copies larger than half the ring, of a length
/// or at an address that is not a multiple of 4, are refused (`Ok(false)`): the caller takes
/// another path.
pub struct Route {
    from: crate::Device,
    to: crate::Device,
    src: Imported,
    dst: Imported,
    link: Option<PeerLink>,
    /// The ring's size.
    ring_bytes: u64,
    ring: parking_lot::Mutex<Ring>,
    host_waits: std::sync::atomic::AtomicU64,
    ring_waits: std::sync::atomic::AtomicU64,
}

/// The regions of a [`Route`]'s ring in use, oldest first: (start, end, the destination's batch
/// that reads it). A region enters once its copies are recorded ([`Ring::read_by`]), so a copy
/// that failed leaves nothing behind.
#[derive(Default)]
struct Ring {
    head: u64,
    used: std::collections::VecDeque<(u64, u64, u64)>,
}

/// Ring regions start at multiples of this (copy offsets must be multiples of 4).
const RING_ALIGN: u64 = 256;

impl Ring {
    /// A region of `len` bytes no copy in flight uses in a ring of `size` bytes: after the
    /// head, or from the start when the end of the ring is too short. A region still being read (its reader batch not
    /// `completed()`) is waited for with `wait(batch)`; returns the region's start and whether
    /// it waited. The caller names the region's reader with [`Ring::read_by`].
    fn reserve(
        &mut self,
        size: u64,
        len: u64,
        completed: &dyn Fn() -> u64,
        wait: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<(u64, bool)> {
        let len = len.next_multiple_of(RING_ALIGN);
        let start = if self.head + len <= size {
            self.head
        } else {
            0
        };
        let end = start + len;
        let done = completed();
        self.used.retain(|&(_, _, b)| b > done);
        // Batches complete in id order: waiting for the newest reader of an overlapping region
        // frees every one of them.
        let newest = self
            .used
            .iter()
            .filter(|&&(s, e, _)| s < end && start < e)
            .map(|&(_, _, b)| b)
            .max();
        if let Some(b) = newest {
            wait(b)?;
            let done = completed().max(b);
            self.used.retain(|&(_, _, r)| r > done);
        }
        self.head = end;
        Ok((start, newest.is_some()))
    }

    /// Marks `len` bytes at `start` (a region [`Ring::reserve`] returned) as read by `batch`.
    fn read_by(&mut self, start: u64, len: u64, batch: u64) {
        self.used
            .push_back((start, start + len.next_multiple_of(RING_ALIGN), batch));
    }
}

impl Route {
    /// A route from `from` to `to` through `ring_bytes` of host memory (both devices opened with
    /// `RuntimeOptions::peer` and able to import host memory; the semaphore link where both
    /// have one).
    pub fn new(from: &crate::Device, to: &crate::Device, ring_bytes: u64) -> Result<Route> {
        let align = [from, to]
            .iter()
            .map(|d| d.peer_caps().map_or(4096, |c| c.host_align))
            .max()
            .unwrap_or(4096);
        let host = HostShared::new(ring_bytes.max(RING_ALIGN), align)?;
        let src = from.import_host(&host)?;
        let dst = to.import_host(&host)?;
        let link = if Route::orders_on_gpus(from, to) {
            Some(from.peer_link(to)?)
        } else {
            None
        };
        Ok(Route {
            from: from.clone(),
            to: to.clone(),
            src,
            dst,
            link,
            ring_bytes: host.size(),
            ring: parking_lot::Mutex::new(Ring::default()),
            host_waits: AtomicU64::new(0),
            ring_waits: AtomicU64::new(0),
        })
    }

    /// Whether a route from `from` to `to` would be ordered on the GPUs: both have `OPAQUE_FD`
    /// timeline semaphores (`peer_caps().timeline_fd`).
    pub fn orders_on_gpus(from: &crate::Device, to: &crate::Device) -> bool {
        let fd = |d: &crate::Device| d.peer_caps().is_some_and(|c| c.timeline_fd);
        fd(from) && fd(to)
    }

    /// Whether the destination's queue waits for the source's on the GPU (else the host waits).
    pub fn gpu_ordered(&self) -> bool {
        self.link.is_some()
    }

    /// The ring's size in bytes (copies of up to half of it are taken).
    pub fn ring_bytes(&self) -> u64 {
        self.ring_bytes
    }

    /// How many copies the host ordered by waiting for the source's batch (no semaphore link).
    pub fn host_waits(&self) -> u64 {
        self.host_waits.load(Ordering::Relaxed)
    }

    /// How many times a ring region was still being read by the destination and waited for.
    pub fn ring_waits(&self) -> u64 {
        self.ring_waits.load(Ordering::Relaxed)
    }

    /// Records a copy of `len` bytes from `src` (an allocation of the source device) to `dst`
    /// (one of the destination): ordered after the source's work recorded so far and before the
    /// destination's work recorded from now on. `Ok(false)`: not taken (see [`Route`]).
    pub fn copy(&self, src: u64, dst: u64, len: u64) -> Result<bool> {
        if len == 0 {
            return Ok(true);
        }
        if !len.is_multiple_of(4)
            || !src.is_multiple_of(4)
            || !dst.is_multiple_of(4)
            || len > self.ring_bytes() / 2
        {
            return Ok(false);
        }
        // One copy at a time per route: the ring, and the link's values reaching the source's
        // queue in increasing order.
        let mut ring = self.ring.lock();
        let exec = self.to.exec();
        let (off, waited) = ring.reserve(self.ring_bytes, len, &|| exec.completed(), &mut |b| {
            exec.wait(b)
        })?;
        if waited {
            self.ring_waits.fetch_add(1, Ordering::Relaxed);
        }
        self.from.copy_to_buffer(src, &self.src.buffer, off, len)?;
        let links: Vec<&PeerLink> = self.link.iter().collect();
        let ticket = self.from.flush_signal(&links)?[0];
        if self
            .to
            .wait_ticket(&self.from, self.link.as_ref(), ticket)?
        {
            self.host_waits.fetch_add(1, Ordering::Relaxed);
        }
        self.to.copy_from_buffer(&self.dst.buffer, off, dst, len)?;
        ring.read_by(off, len, exec.tag());
        Ok(true)
    }
}

impl Drop for Route {
    fn drop(&mut self) {
        // The link and the imported memory may go only once neither device has work using them.
        let _ = self.from.synchronize();
        let _ = self.to.synchronize();
    }
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Route({} -> {}, {} ring bytes, {})",
            self.from.description().name,
            self.to.description().name,
            self.ring_bytes(),
            if self.gpu_ordered() {
                "ordered on the GPUs"
            } else {
                "ordered by the host"
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ring hands out regions in order, wraps to the start when the end is too short, and
    /// waits for exactly the readers of the regions a new one overlaps (the newest of them).
    #[test]
    fn ring_regions_wait_for_their_overlapping_readers() {
        let mut ring = Ring::default();
        let done = std::cell::Cell::new(0u64);
        let waited = std::cell::RefCell::new(vec![]);
        let mut take = |len: u64, reader: u64| {
            let r = ring
                .reserve(4 * RING_ALIGN, len, &|| done.get(), &mut |b| {
                    waited.borrow_mut().push(b);
                    done.set(done.get().max(b));
                    Ok(())
                })
                .unwrap();
            ring.read_by(r.0, len, reader);
            r
        };
        // Readers 1..=3 use [0,256), [256,768), [768,1024): nothing waited for.
        assert_eq!(take(4, 1), (0, false));
        assert_eq!(take(RING_ALIGN + 1, 2), (RING_ALIGN, false));
        assert_eq!(take(RING_ALIGN, 3), (3 * RING_ALIGN, false));
        // The end is full: the next region starts over at 0 and overlaps reader 1 only.
        assert_eq!(take(RING_ALIGN, 4), (0, true));
        assert_eq!(*waited.borrow(), [1]);
        // [256,768) overlaps reader 2; batch 2 completes meanwhile: no wait.
        done.set(2);
        assert_eq!(take(2 * RING_ALIGN, 5), (RING_ALIGN, false));
        // [768,1024) is reader 3's.
        assert_eq!(take(RING_ALIGN, 6), (3 * RING_ALIGN, true));
        assert_eq!(*waited.borrow(), [1, 3]);
        // Wrapped: [0,256) is reader 4's.
        assert_eq!(take(RING_ALIGN, 7), (0, true));
        assert_eq!(*waited.borrow(), [1, 3, 4]);
        // [256,1024) overlaps readers 5 and 6: one wait, for the newer.
        assert_eq!(take(3 * RING_ALIGN, 8), (RING_ALIGN, true));
        assert_eq!(*waited.borrow(), [1, 3, 4, 6]);
        // Everything but reader 7's and 8's regions is free; 8's is still read.
        assert_eq!(ring.used.iter().map(|r| r.2).collect::<Vec<_>>(), [7, 8]);
    }
}
