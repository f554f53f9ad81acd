//! Adapter discovery and selection (`TFWGPU_VISIBLE_DEVICES`, `TFWGPU_ADAPTER`).

use crate::{Error, Result};

/// What the runtime knows of one adapter, before or after opening it.
#[derive(Clone, Debug)]
pub struct AdapterDescription {
    /// Index in enumeration order (the index `TFWGPU_VISIBLE_DEVICES` refers to).
    pub index: usize,
    pub name: String,
    pub backend: String,
    pub driver: String,
    pub driver_info: String,
    pub device_type: String,
    pub vendor: u32,
    pub device: u32,
    /// Smallest and largest subgroup size the adapter may use.
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    pub limits: wgpu::Limits,
    pub features: wgpu::Features,
    /// Bytes of device-local memory, where the backend reports it (Vulkan).
    pub device_memory: Option<u64>,
    /// Cooperative-matrix configurations the adapter supports (empty without
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX`).
    pub cooperative_matrix: Vec<wgpu::CooperativeMatrixProperties>,
}

impl AdapterDescription {
    pub(crate) fn from_adapter(index: usize, adapter: &wgpu::Adapter) -> Self {
        let info = adapter.get_info();
        AdapterDescription {
            index,
            name: info.name.clone(),
            backend: format!("{:?}", info.backend),
            driver: info.driver.clone(),
            driver_info: info.driver_info.clone(),
            device_type: device_type_name(info.device_type).to_string(),
            vendor: info.vendor,
            device: info.device,
            subgroup_min_size: info.subgroup_min_size,
            subgroup_max_size: info.subgroup_max_size,
            limits: adapter.limits(),
            features: adapter.features(),
            device_memory: device_local_memory(adapter),
            cooperative_matrix: if adapter
                .features()
                .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
            {
                adapter.cooperative_matrix_properties()
            } else {
                vec![]
            },
        }
    }

    /// Rank used to pick the best adapter: lower is better.
    pub fn preference(&self) -> u8 {
        match self.device_type.as_str() {
            "discrete" => 0,
            "integrated" => 1,
            "virtual" => 2,
            "other" => 3,
            _ => 4, // cpu
        }
    }

    /// The features of this adapter the kernels can use, by name.
    pub fn useful_features(&self) -> Vec<&'static str> {
        let mut names = vec![];
        for (flag, name) in useful_feature_list() {
            if self.features.contains(flag) {
                names.push(name);
            }
        }
        names
    }
}

/// The size of the largest device-local memory heap of a Vulkan adapter.
#[cfg(any(target_os = "linux", target_os = "windows"))]
fn device_local_memory(adapter: &wgpu::Adapter) -> Option<u64> {
    // SAFETY: only reads properties of the physical device through wgpu-hal's live instance;
    // nothing is created or destroyed.
    unsafe {
        let hal = adapter.as_hal::<wgpu::hal::api::Vulkan>()?;
        let instance = hal.shared_instance().raw_instance();
        let props = instance.get_physical_device_memory_properties(hal.raw_physical_device());
        props.memory_heaps[..props.memory_heap_count as usize]
            .iter()
            .filter(|h| h.flags.contains(ash::vk::MemoryHeapFlags::DEVICE_LOCAL))
            .map(|h| h.size)
            .max()
    }
}

#[cfg(not(any(target_os = "linux", target_os = "windows")))]
fn device_local_memory(_: &wgpu::Adapter) -> Option<u64> {
    None
}

/// The optional features the runtime asks for when the adapter has them.
pub(crate) fn useful_feature_list() -> [(wgpu::Features, &'static str); 8] {
    use wgpu::Features as F;
    [
        (F::SHADER_F16, "SHADER_F16"),
        (F::SUBGROUP, "SUBGROUP"),
        (F::TIMESTAMP_QUERY, "TIMESTAMP_QUERY"),
        (
            F::TIMESTAMP_QUERY_INSIDE_ENCODERS,
            "TIMESTAMP_QUERY_INSIDE_ENCODERS",
        ),
        (
            F::TIMESTAMP_QUERY_INSIDE_PASSES,
            "TIMESTAMP_QUERY_INSIDE_PASSES",
        ),
        (
            F::EXPERIMENTAL_COOPERATIVE_MATRIX,
            "EXPERIMENTAL_COOPERATIVE_MATRIX",
        ),
        (F::PIPELINE_CACHE, "PIPELINE_CACHE"),
        (F::SHADER_INT64, "SHADER_INT64"),
    ]
}

fn device_type_name(t: wgpu::DeviceType) -> &'static str {
    match t {
        wgpu::DeviceType::DiscreteGpu => "discrete",
        wgpu::DeviceType::IntegratedGpu => "integrated",
        wgpu::DeviceType::VirtualGpu => "virtual",
        wgpu::DeviceType::Cpu => "cpu",
        wgpu::DeviceType::Other => "other",
    }
}

pub(crate) fn new_instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    // Validation layers are opt-in (WGPU_VALIDATION=1): they slow every dispatch.
    if std::env::var_os("WGPU_VALIDATION").is_none() {
        desc.flags
            .remove(wgpu::InstanceFlags::VALIDATION | wgpu::InstanceFlags::DEBUG);
    }
    desc.memory_budget_thresholds = wgpu::MemoryBudgetThresholds {
        for_resource_creation: Some(95),
        for_device_loss: None,
    };
    wgpu::Instance::new(desc)
}

/// Every adapter wgpu can open on this machine, in enumeration order.
pub(crate) fn enumerate(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
}

/// Lists every adapter, without opening any device.
pub fn list_adapters() -> Vec<AdapterDescription> {
    let instance = new_instance();
    enumerate(&instance)
        .iter()
        .enumerate()
        .map(|(i, a)| AdapterDescription::from_adapter(i, a))
        .collect()
}

/// Selection rules, read from the environment.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// `TFWGPU_VISIBLE_DEVICES`: enumeration indices, in the order given.
    pub visible: Option<Vec<usize>>,
    /// `TFWGPU_ADAPTER`: case-insensitive substring of the adapter name.
    pub name: Option<String>,
}

impl Selection {
    /// Reads `TFWGPU_VISIBLE_DEVICES` and `TFWGPU_ADAPTER`.
    pub fn from_env() -> Result<Self> {
        let visible = match std::env::var("TFWGPU_VISIBLE_DEVICES") {
            Ok(v) if v.trim().is_empty() => Some(vec![]),
            Ok(v) => Some(
                v.split(',')
                    .map(|s| {
                        s.trim().parse::<usize>().map_err(|_| {
                            Error::InvalidArgument(format!(
                                "TFWGPU_VISIBLE_DEVICES={v:?}: {s:?} is not an adapter index"
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>>>()?,
            ),
            Err(_) => None,
        };
        let name = std::env::var("TFWGPU_ADAPTER")
            .ok()
            .filter(|s| !s.is_empty());
        Ok(Selection { visible, name })
    }

    /// Applies the rules to the enumerated adapters; returns the chosen indices, best first
    /// (or in the order `TFWGPU_VISIBLE_DEVICES` gives). Without rules: every hardware adapter
    /// sorted by preference, falling back to software adapters only when there is no hardware
    /// one, and dropping adapters that duplicate a better backend of the same physical device.
    pub fn choose(&self, adapters: &[AdapterDescription]) -> Result<Vec<usize>> {
        if adapters.is_empty() {
            return Err(Error::NoAdapter(
                "wgpu found no adapter (Vulkan, Metal, DX12 or GL). On Debian, install \
                 mesa-vulkan-drivers for a software adapter, or a GPU driver"
                    .into(),
            ));
        }
        let listing = || {
            adapters
                .iter()
                .map(|a| format!("{}: {} ({}, {})", a.index, a.name, a.backend, a.device_type))
                .collect::<Vec<_>>()
                .join("; ")
        };
        if let Some(v) = &self.visible {
            for &i in v {
                if i >= adapters.len() {
                    return Err(Error::NoAdapter(format!(
                        "TFWGPU_VISIBLE_DEVICES names adapter {i}, but there are only {} ({})",
                        adapters.len(),
                        listing()
                    )));
                }
            }
            if v.is_empty() {
                return Err(Error::NoAdapter("TFWGPU_VISIBLE_DEVICES is empty".into()));
            }
            return Ok(v.clone());
        }
        let mut chosen: Vec<&AdapterDescription> = adapters.iter().collect();
        if let Some(name) = &self.name {
            let needle = name.to_lowercase();
            chosen.retain(|a| a.name.to_lowercase().contains(&needle));
            if chosen.is_empty() {
                return Err(Error::NoAdapter(format!(
                    "TFWGPU_ADAPTER={name:?} matches no adapter ({})",
                    listing()
                )));
            }
        }
        // Prefer Vulkan/Metal/DX12 over GL for the same device.
        let backend_rank = |b: &str| match b {
            "Vulkan" | "Metal" | "Dx12" => 0,
            _ => 1,
        };
        chosen.sort_by_key(|a| (a.preference(), backend_rank(&a.backend), a.index));
        // One physical GPU often appears once per backend (Vulkan and GL): keep, for each
        // (vendor, device, name), the adapters of the best backend only. Identical GPUs on the
        // same backend (two H200s) are all kept.
        let mut best_backend = std::collections::HashMap::new();
        chosen.retain(|a| {
            let b = best_backend
                .entry((a.vendor, a.device, a.name.clone()))
                .or_insert_with(|| a.backend.clone());
            *b == a.backend
        });
        let best = chosen[0].preference();
        if self.name.is_none() && best <= 1 {
            // Hardware adapters exist: software ones would only be slower copies.
            chosen.retain(|a| a.preference() <= 1);
        }
        if self.name.is_none() && best > 1 {
            chosen.truncate(1);
        }
        Ok(chosen.iter().map(|a| a.index).collect())
    }
}
