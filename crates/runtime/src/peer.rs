//! Device-to-device transfers without the host in the loop (Vulkan on Linux only; opt-in with
//! `TFWGPU_PEER=1`, see [`crate::RuntimeOptions::peer`]).
//!
//! wgpu 30 has no cross-device path; its Vulkan HAL lets the runtime add one:
//! - **memory both devices reach**: host memory imported into each device with
//!   `VK_EXT_external_memory_host` ([`HostShared`], [`Device::import_host`]): one device's
//!   queue copies bytes into it, the other's copies them out, and no CPU touches them;
//! - **ordering without a host wait**: the source device's submit signals a binary semaphore
//!   ([`Device::flush_signal`]), exported right after the submit as a sync file
//!   (`VK_KHR_external_semaphore_fd`, `SYNC_FD`); the destination imports it (temporarily) into
//!   a semaphore of its own that its next submit waits for ([`Device::wait_sync`]). The host only
//!   passes a file descriptor along.
//!
//! Where a device offers the memory import but not sync files, [`Device::flush_signal`] returns
//! the batch id instead and the destination waits for it on the host ([`Ticket::Batch`]): the
//! caller counts and reports that fallback.
//!
//! What is not done: no queue-family ownership transfer to/from `VK_QUEUE_FAMILY_EXTERNAL`
//! (wgpu records no such barriers); the imported buffers are only ever copied from or into,
//! which host-coherent memory on the drivers probed keeps correct, but the spec asks for it.

use std::sync::Arc;

use crate::{Error, Result};

/// What a device offers for peer transfers (probed at open; `None` on a device opened without
/// `TFWGPU_PEER=1` or off Vulkan).
#[derive(Clone, Debug, Default)]
pub struct PeerCaps {
    /// `VK_EXT_external_memory_host` is enabled: host memory can be imported.
    pub host_memory: bool,
    /// `minImportedHostPointerAlignment` (bytes): imported pointers and sizes are multiples.
    pub host_align: u64,
    /// `VK_KHR_external_semaphore_fd` is enabled and binary semaphores export and import
    /// `SYNC_FD` handles.
    pub sync_fd: bool,
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

/// A Vulkan binary semaphore of one device (exportable as a sync file where the device can).
pub struct PeerSemaphore {
    #[cfg(target_os = "linux")]
    raw: ash::vk::Semaphore,
    #[cfg(target_os = "linux")]
    device: ash::Device,
}

impl Drop for PeerSemaphore {
    fn drop(&mut self) {
        // SAFETY: the owner drops it only once no submit that signals or waits on it is pending
        // (after the device synchronized).
        #[cfg(target_os = "linux")]
        unsafe {
            self.device.destroy_semaphore(self.raw, None)
        }
    }
}

/// How a destination learns that a source's copy is done.
#[derive(Debug)]
pub enum Ticket {
    /// A sync file exported from the source's signal semaphore (-1: already signaled).
    Fd(i32),
    /// Fallback: the source's batch id, for a host wait on the source device.
    Batch(u64),
}

impl Ticket {
    /// The same ticket for one more destination (a duplicated file descriptor).
    pub fn try_clone(&self) -> Result<Ticket> {
        match *self {
            Ticket::Batch(b) => Ok(Ticket::Batch(b)),
            #[cfg(target_os = "linux")]
            Ticket::Fd(fd) if fd >= 0 => {
                use std::os::fd::{AsFd, BorrowedFd, IntoRawFd};
                // SAFETY: the ticket owns `fd` until it is imported or dropped.
                let b = unsafe { BorrowedFd::borrow_raw(fd) };
                let owned = b
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|e| Error::Gpu(format!("dup of a sync file: {e}")))?;
                Ok(Ticket::Fd(owned.into_raw_fd()))
            }
            Ticket::Fd(fd) => Ok(Ticket::Fd(fd)),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let Ticket::Fd(fd) = *self
            && fd >= 0
        {
            use std::os::fd::{FromRawFd, OwnedFd};
            // SAFETY: a ticket not imported still owns its descriptor.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
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
                let info = vk::PhysicalDeviceExternalSemaphoreInfo::default()
                    .handle_type(vk::ExternalSemaphoreHandleTypeFlags::SYNC_FD);
                let mut ext = vk::ExternalSemaphoreProperties::default();
                instance.get_physical_device_external_semaphore_properties(phys, &info, &mut ext);
                let need = vk::ExternalSemaphoreFeatureFlags::EXPORTABLE
                    | vk::ExternalSemaphoreFeatureFlags::IMPORTABLE;
                if ext.external_semaphore_features.contains(need) {
                    caps.sync_fd = true;
                } else {
                    caps.missing.push(format!(
                        "SYNC_FD semaphores: features {:?}",
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
        if caps.sync_fd {
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

    pub(crate) fn semaphore(device: &wgpu::Device, exportable: bool) -> Result<PeerSemaphore> {
        let (_, dev, _) = raw(device)?;
        let mut export = vk::ExportSemaphoreCreateInfo::default()
            .handle_types(vk::ExternalSemaphoreHandleTypeFlags::SYNC_FD);
        let mut info = vk::SemaphoreCreateInfo::default();
        if exportable {
            info = info.push_next(&mut export);
        }
        // SAFETY: a plain binary semaphore, destroyed by `PeerSemaphore::drop`.
        let raw =
            unsafe { dev.create_semaphore(&info, None) }.map_err(vkerr("vkCreateSemaphore"))?;
        Ok(PeerSemaphore { raw, device: dev })
    }

    /// Stages `sem` to be signaled by the queue's next submit (the caller makes that submit
    /// the one it means, under the runtime's submit order).
    pub(crate) fn stage_signal(queue: &wgpu::Queue, sem: vk::Semaphore) {
        // SAFETY: the semaphore lives until the device synchronized after its use.
        unsafe {
            if let Some(q) = queue.as_hal::<wgpu::hal::api::Vulkan>() {
                q.add_signal_semaphore(sem, None);
            }
        }
    }

    impl PeerSemaphore {
        pub(crate) fn raw(&self) -> vk::Semaphore {
            self.raw
        }
    }

    /// Exports the pending signal of `sem` as a sync file.
    pub(crate) fn export(device: &wgpu::Device, sem: &PeerSemaphore) -> Result<Ticket> {
        let (instance, dev, _) = raw(device)?;
        let ext = ash::khr::external_semaphore_fd::Device::new(&instance, &dev);
        let info = vk::SemaphoreGetFdInfoKHR::default()
            .semaphore(sem.raw)
            .handle_type(vk::ExternalSemaphoreHandleTypeFlags::SYNC_FD);
        // SAFETY: the semaphore's signal was submitted just before.
        let fd = unsafe { ext.get_semaphore_fd(&info) }.map_err(vkerr("vkGetSemaphoreFdKHR"))?;
        Ok(Ticket::Fd(fd))
    }

    /// Imports `fd` temporarily into `sem` and stages a wait for it on the queue's next
    /// submit (all commands wait).
    pub(crate) fn wait(
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        sem: &PeerSemaphore,
        ticket: Ticket,
    ) -> Result<()> {
        let fd = match ticket {
            Ticket::Fd(fd) => fd,
            Ticket::Batch(_) => {
                return Err(Error::InvalidArgument(
                    "a batch ticket is waited for on the host".into(),
                ));
            }
        };
        let (instance, dev, _) = raw(device)?;
        let ext = ash::khr::external_semaphore_fd::Device::new(&instance, &dev);
        let info = vk::ImportSemaphoreFdInfoKHR::default()
            .semaphore(sem.raw)
            .flags(vk::SemaphoreImportFlags::TEMPORARY)
            .handle_type(vk::ExternalSemaphoreHandleTypeFlags::SYNC_FD)
            .fd(fd);
        // On success Vulkan owns the descriptor; on failure the ticket closes it.
        // SAFETY: `sem` has no pending operation (a fresh semaphore per import).
        unsafe { ext.import_semaphore_fd(&info) }.map_err(vkerr("vkImportSemaphoreFdKHR"))?;
        std::mem::forget(ticket);
        // SAFETY: the semaphore lives until the device synchronized after its use.
        unsafe {
            let q = queue
                .as_hal::<wgpu::hal::api::Vulkan>()
                .ok_or_else(|| Error::Gpu("not a Vulkan queue".into()))?;
            q.add_wait_semaphore(sem.raw, None, vk::PipelineStageFlags::ALL_COMMANDS);
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
