//! `tfwgpu-bench vkprobe [--pair A,B] [--rounds N]`: what the Vulkan drivers offer for ordering
//! work between two GPUs without the host in the loop (issue 8), probed with raw Vulkan (ash),
//! outside wgpu.
//!
//! Session 11 (bench/RESULTS.md, dual11) found the H200 driver exports no SYNC_FD semaphores and
//! that a shader cannot poll another GPU's store. Left open: whether a timeline semaphore
//! exported as an OPAQUE_FD from one GPU can be imported by the other (the spec promises it only
//! between devices with equal deviceUUID and driverUUID, so a driver may refuse it or accept it),
//! and whether the GPUs form a device group. This prints, per physical device, its UUIDs and the
//! external semaphore handle types it can export and import; the device groups; and, for the
//! pair (default: the first two devices, or the first one twice), an OPAQUE_FD timeline
//! semaphore exported by A and imported into B: B's queue waits on it, A's queue signals it,
//! and the host times how long B's fence takes to follow (rounds, median). Every wait is
//! bounded (a timed-out wait is released by a host signal on B), so a driver that accepts the
//! import and never delivers the signal is reported, not hung on.

use ash::vk;
use std::ffi::CStr;
use std::os::fd::FromRawFd;
use std::time::{Duration, Instant};

/// The probe's answer for the pair (also the test's handle on it).
#[derive(Debug, Default)]
pub struct Report {
    pub devices: usize,
    pub groups: Vec<usize>,
    /// `None`: not tried (a device lacks VK_KHR_external_semaphore_fd or OPAQUE_FD export /
    /// import); `Some(Err)`: a Vulkan call failed; `Some(Ok(latencies))`: B's fence followed A's
    /// signal in every round (host-observed microseconds).
    pub cross: Option<Result<Vec<f64>, String>>,
}

pub fn run(args: &[String]) -> Result<(), String> {
    let mut pair = None;
    let mut rounds = 20usize;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--pair" => {
                let v = it.next().ok_or("--pair needs A,B")?;
                let (x, y) = v.split_once(',').ok_or("--pair needs A,B")?;
                pair = Some((
                    x.parse().map_err(|_| "bad --pair")?,
                    y.parse().map_err(|_| "bad --pair")?,
                ));
            }
            "--rounds" => {
                rounds = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--rounds needs a number")?
            }
            other => return Err(format!("vkprobe: unknown flag {other:?}")),
        }
    }
    let r = probe(pair, rounds.max(1), true)?;
    println!(
        "{} physical devices in {} groups",
        r.devices,
        r.groups.len()
    );
    match &r.cross {
        None => println!("cross-device OPAQUE_FD timeline semaphore: not tried (see above)"),
        Some(Err(e)) => println!("cross-device OPAQUE_FD timeline semaphore: FAILED: {e}"),
        Some(Ok(l)) => {
            let mut s = l.clone();
            s.sort_by(f64::total_cmp);
            println!(
                "cross-device OPAQUE_FD timeline semaphore: WORKS; B's fence followed A's signal in every round: median {:.1} us, min {:.1}, max {:.1} ({} rounds, host-observed: A's submit to B's fence seen)",
                s[s.len() / 2],
                s[0],
                s[s.len() - 1],
                s.len()
            );
        }
    }
    Ok(())
}

fn vk_err(what: &str) -> impl Fn(vk::Result) -> String + '_ {
    move |e| format!("{what}: {e:?}")
}

/// Probes every physical device; `print`: the per-device lines. See the module docs.
pub fn probe(pair: Option<(usize, usize)>, rounds: usize, print: bool) -> Result<Report, String> {
    // SAFETY: loading the system's Vulkan loader; every handle created below is destroyed
    // before returning, after the devices are idle.
    let entry = unsafe { ash::Entry::load() }.map_err(|e| format!("no Vulkan loader: {e}"))?;
    let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_2);
    let instance = unsafe {
        entry.create_instance(
            &vk::InstanceCreateInfo::default().application_info(&app),
            None,
        )
    }
    .map_err(vk_err("vkCreateInstance"))?;
    let out = probe_instance(&instance, pair, rounds, print);
    unsafe { instance.destroy_instance(None) };
    out
}

fn has_ext(instance: &ash::Instance, pd: vk::PhysicalDevice, name: &CStr) -> bool {
    unsafe { instance.enumerate_device_extension_properties(pd) }
        .map(|v| v.iter().any(|e| e.extension_name_as_c_str() == Ok(name)))
        .unwrap_or(false)
}

fn uuid(u: &[u8; vk::UUID_SIZE]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

/// (exportable, importable) for a handle type and semaphore kind on a physical device.
fn sem_caps(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
    ty: vk::ExternalSemaphoreHandleTypeFlags,
    timeline: bool,
) -> (bool, bool) {
    let mut tinfo = vk::SemaphoreTypeCreateInfo::default()
        .semaphore_type(vk::SemaphoreType::TIMELINE)
        .initial_value(0);
    let mut info = vk::PhysicalDeviceExternalSemaphoreInfo::default().handle_type(ty);
    if timeline {
        info = info.push_next(&mut tinfo);
    }
    let mut out = vk::ExternalSemaphoreProperties::default();
    unsafe { instance.get_physical_device_external_semaphore_properties(pd, &info, &mut out) };
    let f = out.external_semaphore_features;
    (
        f.contains(vk::ExternalSemaphoreFeatureFlags::EXPORTABLE),
        f.contains(vk::ExternalSemaphoreFeatureFlags::IMPORTABLE),
    )
}

fn probe_instance(
    instance: &ash::Instance,
    pair: Option<(usize, usize)>,
    rounds: usize,
    print: bool,
) -> Result<Report, String> {
    let pds = unsafe { instance.enumerate_physical_devices() }
        .map_err(vk_err("vkEnumeratePhysicalDevices"))?;
    let mut report = Report {
        devices: pds.len(),
        ..Report::default()
    };
    let fd_ext = ash::khr::external_semaphore_fd::NAME;
    let mut opaque_ok = vec![false; pds.len()];
    for (i, &pd) in pds.iter().enumerate() {
        let mut id = vk::PhysicalDeviceIDProperties::default();
        let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut id);
        unsafe { instance.get_physical_device_properties2(pd, &mut p2) };
        let name = p2
            .properties
            .device_name_as_c_str()
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (device_uuid, driver_uuid) = (uuid(&id.device_uuid), uuid(&id.driver_uuid));
        let ext = has_ext(instance, pd, fd_ext);
        let caps = |ty, tl| sem_caps(instance, pd, ty, tl);
        let ot = caps(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD, true);
        let ob = caps(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD, false);
        let sb = caps(vk::ExternalSemaphoreHandleTypeFlags::SYNC_FD, false);
        opaque_ok[i] = ext && ot.0 && ot.1;
        if print {
            let yn = |(e, i): (bool, bool)| format!("export {e}, import {i}");
            println!("[{i}] {name}: deviceUUID {device_uuid}, driverUUID {driver_uuid}");
            println!(
                "    VK_KHR_external_semaphore_fd {ext}; OPAQUE_FD timeline: {}; OPAQUE_FD binary: {}; SYNC_FD binary: {}",
                yn(ot),
                yn(ob),
                yn(sb)
            );
            println!(
                "    VK_KHR_device_group {}, VK_EXT_external_memory_host {}",
                has_ext(instance, pd, ash::khr::device_group::NAME),
                has_ext(instance, pd, ash::ext::external_memory_host::NAME)
            );
        }
    }
    let n = unsafe { instance.enumerate_physical_device_groups_len() }
        .map_err(vk_err("vkEnumeratePhysicalDeviceGroups"))?;
    let mut groups = vec![vk::PhysicalDeviceGroupProperties::default(); n];
    unsafe { instance.enumerate_physical_device_groups(&mut groups) }
        .map_err(vk_err("vkEnumeratePhysicalDeviceGroups"))?;
    for (g, grp) in groups.iter().enumerate() {
        let members: Vec<usize> = grp.physical_devices[..grp.physical_device_count as usize]
            .iter()
            .filter_map(|m| pds.iter().position(|p| p == m))
            .collect();
        if print {
            println!(
                "device group {g}: devices {members:?}, subset allocation {}",
                grp.subset_allocation != 0
            );
        }
        report.groups.push(members.len());
    }
    if pds.is_empty() {
        return Ok(report);
    }
    let (a, b) = pair.unwrap_or(if pds.len() > 1 { (0, 1) } else { (0, 0) });
    if a >= pds.len() || b >= pds.len() {
        return Err(format!("--pair {a},{b}: only {} devices", pds.len()));
    }
    if print {
        println!("pair: A = [{a}], B = [{b}]");
    }
    if opaque_ok[a] && opaque_ok[b] {
        report.cross = Some(cross(instance, pds[a], pds[b], rounds));
    } else if print {
        println!(
            "    skipped: a device of the pair offers no VK_KHR_external_semaphore_fd or no OPAQUE_FD timeline export and import"
        );
    }
    Ok(report)
}

/// A logical device with one compute queue and the extension; (device, queue).
struct Dev {
    device: ash::Device,
    queue: vk::Queue,
    fd: ash::khr::external_semaphore_fd::Device,
}

fn open(instance: &ash::Instance, pd: vk::PhysicalDevice) -> Result<Dev, String> {
    let families = unsafe { instance.get_physical_device_queue_family_properties(pd) };
    let family = families
        .iter()
        .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .ok_or("no compute queue family")? as u32;
    let prio = [1.0f32];
    let qinfo = [vk::DeviceQueueCreateInfo::default()
        .queue_family_index(family)
        .queue_priorities(&prio)];
    let exts = [ash::khr::external_semaphore_fd::NAME.as_ptr()];
    let mut v12 = vk::PhysicalDeviceVulkan12Features::default().timeline_semaphore(true);
    let info = vk::DeviceCreateInfo::default()
        .queue_create_infos(&qinfo)
        .enabled_extension_names(&exts)
        .push_next(&mut v12);
    let device =
        unsafe { instance.create_device(pd, &info, None) }.map_err(vk_err("vkCreateDevice"))?;
    let queue = unsafe { device.get_device_queue(family, 0) };
    let fd = ash::khr::external_semaphore_fd::Device::new(instance, &device);
    Ok(Dev { device, queue, fd })
}

fn timeline(dev: &Dev, export: bool) -> Result<vk::Semaphore, String> {
    let mut t = vk::SemaphoreTypeCreateInfo::default()
        .semaphore_type(vk::SemaphoreType::TIMELINE)
        .initial_value(0);
    let mut e = vk::ExportSemaphoreCreateInfo::default()
        .handle_types(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD);
    let mut info = vk::SemaphoreCreateInfo::default().push_next(&mut t);
    if export {
        info = info.push_next(&mut e);
    }
    unsafe { dev.device.create_semaphore(&info, None) }.map_err(vk_err("vkCreateSemaphore"))
}

/// B waits on value `v` of `sem` (an empty batch), signalling `fence`.
fn submit_wait(dev: &Dev, sem: vk::Semaphore, v: u64, fence: vk::Fence) -> Result<(), String> {
    let sems = [sem];
    let vals = [v];
    let stages = [vk::PipelineStageFlags::ALL_COMMANDS];
    let mut tl = vk::TimelineSemaphoreSubmitInfo::default().wait_semaphore_values(&vals);
    let submit = vk::SubmitInfo::default()
        .wait_semaphores(&sems)
        .wait_dst_stage_mask(&stages)
        .push_next(&mut tl);
    unsafe { dev.device.queue_submit(dev.queue, &[submit], fence) }
        .map_err(vk_err("vkQueueSubmit (B's wait)"))
}

/// A signals value `v` of `sem` (an empty batch).
fn submit_signal(dev: &Dev, sem: vk::Semaphore, v: u64) -> Result<(), String> {
    let sems = [sem];
    let vals = [v];
    let mut tl = vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&vals);
    let submit = vk::SubmitInfo::default()
        .signal_semaphores(&sems)
        .push_next(&mut tl);
    unsafe {
        dev.device
            .queue_submit(dev.queue, &[submit], vk::Fence::null())
    }
    .map_err(vk_err("vkQueueSubmit (A's signal)"))
}

fn cross(
    instance: &ash::Instance,
    pa: vk::PhysicalDevice,
    pb: vk::PhysicalDevice,
    rounds: usize,
) -> Result<Vec<f64>, String> {
    let da = open(instance, pa)?;
    let db = match open(instance, pb) {
        Ok(d) => d,
        Err(e) => {
            unsafe { da.device.destroy_device(None) };
            return Err(e);
        }
    };
    let mut made: Vec<(usize, vk::Semaphore)> = vec![];
    let mut fence = vk::Fence::null();
    let out = (|| {
        let sa = timeline(&da, true)?;
        made.push((0, sa));
        let sb = timeline(&db, false)?;
        made.push((1, sb));
        let fd = unsafe {
            da.fd.get_semaphore_fd(
                &vk::SemaphoreGetFdInfoKHR::default()
                    .semaphore(sa)
                    .handle_type(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD),
            )
        }
        .map_err(vk_err("vkGetSemaphoreFdKHR (A)"))?;
        // A successful import takes the fd's ownership; a failed one leaves it to us.
        let imported = unsafe {
            db.fd.import_semaphore_fd(
                &vk::ImportSemaphoreFdInfoKHR::default()
                    .semaphore(sb)
                    .handle_type(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD)
                    .fd(fd),
            )
        };
        if let Err(e) = imported {
            // SAFETY: the fd came from vkGetSemaphoreFdKHR and was not consumed: ours to close.
            drop(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
            return Err(format!(
                "vkImportSemaphoreFdKHR (B) refused A's OPAQUE_FD: {e:?}"
            ));
        }
        fence = unsafe {
            db.device
                .create_fence(&vk::FenceCreateInfo::default(), None)
        }
        .map_err(vk_err("vkCreateFence"))?;
        let mut lat = vec![];
        for r in 1..=rounds as u64 {
            unsafe { db.device.reset_fences(&[fence]) }.map_err(vk_err("vkResetFences"))?;
            submit_wait(&db, sb, r, fence)?;
            std::thread::sleep(Duration::from_millis(5));
            let early =
                unsafe { db.device.get_fence_status(fence) }.map_err(vk_err("vkGetFenceStatus"))?;
            if early {
                return Err(format!(
                    "round {r}: B's wait completed before A signalled (the import shares no payload)"
                ));
            }
            let t0 = Instant::now();
            submit_signal(&da, sa, r)?;
            let done = unsafe { db.device.wait_for_fences(&[fence], true, 2_000_000_000) };
            match done {
                Ok(()) => lat.push(t0.elapsed().as_secs_f64() * 1e6),
                Err(vk::Result::TIMEOUT) => {
                    // Release B's queue from the host, through its own semaphore.
                    let _ = unsafe {
                        db.device.signal_semaphore(
                            &vk::SemaphoreSignalInfo::default().semaphore(sb).value(r),
                        )
                    };
                    let _ = unsafe { db.device.wait_for_fences(&[fence], true, 2_000_000_000) };
                    return Err(format!(
                        "round {r}: the import was accepted but A's signal did not reach B within 2 s"
                    ));
                }
                Err(e) => return Err(format!("vkWaitForFences (B): {e:?}")),
            }
        }
        Ok(lat)
    })();
    unsafe {
        let _ = da.device.device_wait_idle();
        let _ = db.device.device_wait_idle();
        if fence != vk::Fence::null() {
            db.device.destroy_fence(fence, None);
        }
        for (d, s) in made {
            if d == 0 {
                da.device.destroy_semaphore(s, None);
            } else {
                db.device.destroy_semaphore(s, None);
            }
        }
        db.device.destroy_device(None);
        da.device.destroy_device(None);
    }
    out
}

#[cfg(test)]
mod tests {
    /// On any machine with a Vulkan device (lavapipe in CI): every device is listed, every
    /// device is in a group, and the pair is either skipped (lavapipe of Mesa 22 has no
    /// VK_KHR_external_semaphore_fd) or gives a definite answer without hanging.
    #[test]
    fn probe_lists_devices_and_answers() {
        let r = super::probe(None, 3, false).expect("probe");
        assert!(r.devices >= 1, "no Vulkan device");
        assert_eq!(
            r.groups.iter().sum::<usize>(),
            r.devices,
            "groups cover the devices"
        );
        if let Some(Ok(lat)) = &r.cross {
            assert_eq!(lat.len(), 3);
        }
    }
}
