//! The Kernel trait, attributes, operands, the recording context, and the op registry.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use crate::device::DeviceInner;
use crate::exec::{BufferRange, Pipeline};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::{DType, Error, HostTensor, Result, num_elements};

/// An attribute value, as TensorFlow's NodeDef attributes carry them.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    Bool(bool),
    Int(i64),
    Float(f32),
    Type(DType),
    Str(String),
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    Types(Vec<DType>),
    /// A shape; `None` for unknown rank, -1 for unknown dimensions.
    Shape(Option<Vec<i64>>),
}

/// A node's attributes, read once when a kernel is built.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attrs(BTreeMap<String, AttrValue>);

impl Attrs {
    pub fn new() -> Self {
        Attrs::default()
    }

    /// Builder-style insert.
    pub fn with(mut self, name: &str, value: AttrValue) -> Self {
        self.0.insert(name.to_string(), value);
        self
    }

    pub fn set(&mut self, name: &str, value: AttrValue) {
        self.0.insert(name.to_string(), value);
    }

    pub fn get(&self, name: &str) -> Option<&AttrValue> {
        self.0.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &AttrValue)> {
        self.0.iter()
    }

    /// A bool attribute, or `default` when absent.
    pub fn bool_or(&self, name: &str, default: bool) -> Result<bool> {
        match self.0.get(name) {
            None => Ok(default),
            Some(AttrValue::Bool(b)) => Ok(*b),
            Some(other) => Err(Error::InvalidArgument(format!(
                "attribute {name} must be a bool, got {other:?}"
            ))),
        }
    }

    /// An int attribute, or `default` when absent.
    pub fn int_or(&self, name: &str, default: i64) -> Result<i64> {
        match self.0.get(name) {
            None => Ok(default),
            Some(AttrValue::Int(i)) => Ok(*i),
            Some(other) => Err(Error::InvalidArgument(format!(
                "attribute {name} must be an int, got {other:?}"
            ))),
        }
    }

    /// A float attribute, or `default` when absent.
    pub fn float_or(&self, name: &str, default: f32) -> Result<f32> {
        match self.0.get(name) {
            None => Ok(default),
            Some(AttrValue::Float(f)) => Ok(*f),
            Some(other) => Err(Error::InvalidArgument(format!(
                "attribute {name} must be a float, got {other:?}"
            ))),
        }
    }

    /// A required type attribute.
    pub fn dtype(&self, name: &str) -> Result<DType> {
        match self.0.get(name) {
            Some(AttrValue::Type(t)) => Ok(*t),
            None => Err(Error::InvalidArgument(format!(
                "missing type attribute {name}"
            ))),
            Some(other) => Err(Error::InvalidArgument(format!(
                "attribute {name} must be a type, got {other:?}"
            ))),
        }
    }

    /// A type attribute, or `None` when absent.
    pub fn dtype_opt(&self, name: &str) -> Result<Option<DType>> {
        match self.0.get(name) {
            None => Ok(None),
            Some(_) => self.dtype(name).map(Some),
        }
    }
}

/// dtype and shape of a tensor.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorDesc {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorDesc {
    pub fn new(dtype: DType, shape: &[usize]) -> Self {
        TensorDesc {
            dtype,
            shape: shape.to_vec(),
        }
    }

    pub fn num_elements(&self) -> usize {
        num_elements(&self.shape)
    }

    /// Bytes of the tensor's data.
    pub fn byte_size(&self) -> u64 {
        (self.num_elements() * self.dtype.size()) as u64
    }
}

/// A tensor in device memory, seen by a kernel: its description and its device address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceRef {
    pub desc: TensorDesc,
    pub addr: u64,
}

/// One input of a kernel: in device memory, or in host memory (shapes, axes).
#[derive(Clone, Copy, Debug)]
pub enum Operand<'a> {
    Device(&'a DeviceRef),
    Host(&'a HostTensor),
}

impl<'a> Operand<'a> {
    pub fn dtype(&self) -> DType {
        match self {
            Operand::Device(d) => d.desc.dtype,
            Operand::Host(h) => h.dtype,
        }
    }

    pub fn shape(&self) -> &'a [usize] {
        match self {
            Operand::Device(d) => &d.desc.shape,
            Operand::Host(h) => &h.shape,
        }
    }

    pub fn desc(&self) -> TensorDesc {
        TensorDesc::new(self.dtype(), self.shape())
    }

    /// The device tensor, or an error naming the input when it is in host memory.
    pub fn device(&self, op: &str, index: usize) -> Result<&'a DeviceRef> {
        match self {
            Operand::Device(d) => Ok(d),
            Operand::Host(_) => Err(Error::InvalidArgument(format!(
                "{op}: input {index} must be in device memory"
            ))),
        }
    }

    /// The host tensor, or an error naming the input when it is in device memory.
    pub fn host(&self, op: &str, index: usize) -> Result<&'a HostTensor> {
        match self {
            Operand::Host(h) => Ok(h),
            Operand::Device(_) => Err(Error::InvalidArgument(format!(
                "{op}: input {index} must be in host memory"
            ))),
        }
    }
}

/// One op implementation, built once per node from its attributes.
pub trait Kernel: Send + Sync {
    /// TensorFlow's op name.
    fn op(&self) -> &'static str;
    /// Validates the inputs and computes the outputs' dtypes and shapes.
    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>>;
    /// Records the GPU work that computes `outputs` (already allocated) from `inputs`.
    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()>;
    /// Inputs whose buffer output 0 may reuse when it has the output's dtype and shape and
    /// nothing else holds it (TensorFlow's input forwarding): kernels that read each element
    /// before writing the same element, at the same index, only.
    fn forwardable_inputs(&self) -> &'static [usize] {
        &[]
    }
    /// Computes the outputs' dtypes and shapes with access to the device, for kernels whose
    /// output shapes depend on the input data (Where): such a kernel may record GPU work here
    /// and block on `KernelContext::read` of its result. Executors call this (through
    /// `Device::output_descs`) instead of `outputs`; the default is `outputs`.
    fn outputs_on_device(
        &self,
        ctx: &KernelContext,
        inputs: &[Operand],
    ) -> Result<Vec<TensorDesc>> {
        let _ = ctx;
        self.outputs(inputs)
    }
}

/// Builds a kernel from a node's attributes.
pub type Factory = fn(&Attrs) -> Result<Box<dyn Kernel>>;

/// One row of a registration table.
#[derive(Clone, Copy)]
pub struct OpDef {
    /// TensorFlow's op name.
    pub op: &'static str,
    /// The attribute constrained to `dtypes` (usually "T"); empty when unconstrained.
    pub type_attr: &'static str,
    /// The dtypes registered for `type_attr`.
    pub dtypes: &'static [DType],
    /// Inputs that TensorFlow must deliver in host memory: (index, argument name in the op's
    /// TensorFlow definition).
    pub host_inputs: &'static [(usize, &'static str)],
    /// Builds the kernel.
    pub factory: Factory,
}

/// A second type attribute of an op whose kernels support only some dtypes (Cast's DstT,
/// GatherV2's Tindices...): the plugin registers one kernel per allowed combination, so that
/// TensorFlow places other combinations elsewhere instead of failing on this device.
#[derive(Clone, Copy, Debug)]
pub struct TypeConstraint {
    pub op: &'static str,
    pub attr: &'static str,
    pub dtypes: &'static [DType],
}

/// Every op the runtime implements.
pub struct Registry {
    ops: HashMap<&'static str, OpDef>,
    host: HashMap<&'static str, crate::host_ops::HostOpDef>,
    labeled_host: HashMap<&'static str, crate::host_ops::HostOpDef>,
}

impl Registry {
    fn build() -> Self {
        let mut defs = Vec::new();
        crate::kernels::register_all(&mut defs);
        let mut ops = HashMap::new();
        for d in defs {
            let prev = ops.insert(d.op, d);
            assert!(prev.is_none(), "op {} registered twice", d.op);
        }
        let mut host = HashMap::new();
        for d in crate::host_ops::HOST_OPS {
            let prev = host.insert(d.op, *d);
            assert!(prev.is_none(), "host op {} registered twice", d.op);
        }
        let labeled_host = crate::host_ops::LABELED_HOST_OPS
            .iter()
            .map(|d| (d.op, *d))
            .collect();
        Registry {
            ops,
            host,
            labeled_host,
        }
    }

    /// The process-wide registry.
    pub fn global() -> &'static Registry {
        static REG: OnceLock<Registry> = OnceLock::new();
        REG.get_or_init(Registry::build)
    }

    pub fn get(&self, op: &str) -> Option<&OpDef> {
        self.ops.get(op)
    }

    /// The host-memory kernel of `op` for `dtype`, if there is one.
    pub fn host(&self, op: &str, dtype: DType) -> Option<&crate::host_ops::HostOpDef> {
        self.host.get(op).filter(|d| d.dtypes.contains(&dtype))
    }

    /// All host-memory kernels, sorted by name.
    pub fn host_ops(&self) -> Vec<&crate::host_ops::HostOpDef> {
        let mut v: Vec<_> = self.host.values().collect();
        v.sort_by_key(|d| d.op);
        v
    }

    /// The host kernels registered only under a label (`host_ops::LABELED_HOST_OPS`), sorted
    /// by name.
    pub fn labeled_host_ops(&self) -> Vec<&crate::host_ops::HostOpDef> {
        let mut v: Vec<_> = self.labeled_host.values().collect();
        v.sort_by_key(|d| d.op);
        v
    }

    /// Builds the labeled host kernel of `op` (`host_ops::LABELED_HOST_OPS`).
    pub fn build_labeled_host_kernel(
        &self,
        op: &str,
        attrs: &Attrs,
    ) -> Result<Box<dyn crate::host_ops::HostKernel>> {
        let def = self.labeled_host.get(op).ok_or_else(|| {
            Error::Unimplemented(format!("op {op} has no tfwgpu labeled host kernel"))
        })?;
        (def.factory)(attrs)
    }

    /// Builds the host kernel for `op` with `attrs` (its type attribute selects the dtype).
    pub fn build_host_kernel(
        &self,
        op: &str,
        attrs: &Attrs,
    ) -> Result<Box<dyn crate::host_ops::HostKernel>> {
        let def = self
            .host
            .get(op)
            .ok_or_else(|| Error::Unimplemented(format!("op {op} has no tfwgpu host kernel")))?;
        (def.factory)(attrs)
    }

    /// All registered ops, sorted by name.
    pub fn ops(&self) -> Vec<&OpDef> {
        let mut v: Vec<_> = self.ops.values().collect();
        v.sort_by_key(|d| d.op);
        v
    }

    /// Builds the kernel for `op`, checking the type constraint.
    pub fn build_kernel(&self, op: &str, attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        let def = self
            .get(op)
            .ok_or_else(|| Error::Unimplemented(format!("op {op} has no tfwgpu kernel")))?;
        if !def.type_attr.is_empty()
            && let Some(t) = attrs.dtype_opt(def.type_attr)?
            && !def.dtypes.contains(&t)
        {
            return Err(Error::Unimplemented(format!(
                "{op} has no tfwgpu kernel for {}={t}",
                def.type_attr
            )));
        }
        (def.factory)(attrs)
    }
}

/// The largest number of workgroups a 1-D dispatch puts on the x axis.
pub const MAX_GROUPS_X: u32 = 65535;

/// Splits `threads` invocations in workgroups of `wg` into a 2-D grid. Returns the grid and
/// the number of invocations per grid row, for shaders computing
/// `index = gid.y * row + gid.x`.
pub fn grid_1d(threads: u64, wg: u32) -> ([u32; 3], u32) {
    let groups = threads.div_ceil(wg as u64).max(1);
    let x = groups.min(MAX_GROUPS_X as u64) as u32;
    let y = groups.div_ceil(x as u64) as u32;
    ([x, y, 1], x * wg)
}

/// `groups` workgroups as a (gx, gy) grid, gx at most `MAX_GROUPS_X` (none: an empty grid of
/// one column); an Unimplemented error "`what` are more than one dispatch can cover" when gy
/// is past that limit too.
pub(crate) fn grid_2d(groups: usize, what: impl FnOnce() -> String) -> Result<(usize, usize)> {
    let gx = groups.clamp(1, MAX_GROUPS_X as usize);
    let gy = groups.div_ceil(gx);
    if gy > MAX_GROUPS_X as usize {
        return Err(Error::Unimplemented(format!(
            "{} are more than one dispatch can cover",
            what()
        )));
    }
    Ok((gx, gy))
}

/// How many counters `KernelContext::arrival_counters` holds per device (16 KiB).
pub const ARRIVAL_COUNTERS: usize = 4096;

/// What a kernel sees while it records: pipelines, bindings, dispatches, temporaries.
pub struct KernelContext<'d> {
    pub(crate) dev: &'d DeviceInner,
    temps: parking_lot::Mutex<Vec<u64>>,
    /// Scratch buffers by (name, size): see [`KernelContext::scratch`].
    scratch: parking_lot::Mutex<Vec<(&'static str, u64, BufferRange)>>,
}

impl<'d> KernelContext<'d> {
    pub(crate) fn new(dev: &'d DeviceInner) -> Self {
        KernelContext {
            dev,
            temps: parking_lot::Mutex::new(vec![]),
            scratch: parking_lot::Mutex::new(vec![]),
        }
    }

    /// Whether the adapter runs shaders on the CPU (Mesa's llvmpipe / lavapipe), which leaves a
    /// shader's loops after `kernels::wgsl::LOOP_LIMIT` iterations per invocation: kernels
    /// whose invocations can walk longer ranges split them there.
    pub fn loop_limited(&self) -> bool {
        self.dev.desc.device_type == "cpu"
    }

    /// The device's limits.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.dev.limits
    }

    /// The device's enabled features.
    pub fn features(&self) -> wgpu::Features {
        self.dev.features
    }

    /// The adapter's tuner ([`crate::tune::Tuner::of`], kept by the device).
    pub fn tuner(&self) -> &crate::tune::Tuner {
        self.dev
            .tuner
            .get_or_init(|| crate::tune::Tuner::of(&self.dev.desc))
    }

    /// A cached pipeline, compiled on first use.
    pub fn pipeline(
        &self,
        key: PipelineKey,
        source: impl FnOnce() -> ShaderSource,
    ) -> Result<Arc<Pipeline>> {
        self.dev.kernels.get(key, source)
    }

    /// A cached pipeline kept in `slot` by the caller (a kernel's per-shape plan): the first
    /// call on a device looks `key()` up (compiling `source()` on a miss) and keeps the
    /// pipeline with the device's cache number; later calls on that device take it from the
    /// slot without building the key (a string) and hashing it. On another device the key is
    /// looked up every time. The slot keeps its pipeline alive when the cache evicts it.
    pub fn pipeline_kept(
        &self,
        slot: &OnceLock<(u64, Arc<Pipeline>)>,
        key: impl FnOnce() -> PipelineKey,
        source: impl FnOnce() -> ShaderSource,
    ) -> Result<Arc<Pipeline>> {
        let id = self.dev.kernels.id();
        if let Some((kept, p)) = slot.get()
            && *kept == id
        {
            return Ok(p.clone());
        }
        let p = self.dev.kernels.get(key(), source)?;
        let _ = slot.set((id, p.clone()));
        Ok(p)
    }

    /// A binding for a whole tensor. Storage bindings need an aligned offset; an input whose
    /// address is not aligned (a slice TensorFlow forwarded) is first copied to an aligned
    /// temporary.
    pub fn bind(&self, t: &DeviceRef) -> Result<BufferRange> {
        self.bind_bytes(t.addr, t.desc.byte_size())
    }

    /// A binding for `size` bytes at `addr`.
    pub fn bind_bytes(&self, addr: u64, size: u64) -> Result<BufferRange> {
        if size == 0 {
            // An empty tensor may have no address at all; bind a scratch word instead.
            return self.temp(4);
        }
        let r = self.dev.alloc.resolve(addr)?;
        if size > r.remaining {
            return Err(Error::InvalidArgument(format!(
                "a tensor of {size} bytes at {addr:#x} runs past its allocation ({} bytes left)",
                r.remaining
            )));
        }
        let align = self.dev.limits.min_storage_buffer_offset_alignment as u64;
        if r.offset.is_multiple_of(align) {
            return Ok(r.range(size));
        }
        if !r.offset.is_multiple_of(4) {
            return Err(Error::InvalidArgument(format!(
                "address {addr:#x} is not 4-byte aligned"
            )));
        }
        // Allocations are granule-sized, so a 4-aligned address has a multiple of 4 bytes left.
        let tmp = self.temp(size)?;
        crate::kernels::copy::copy_range(self, &r.range(size), &tmp, size.next_multiple_of(4))?;
        Ok(tmp)
    }

    /// A temporary device buffer of `size` bytes, freed (after the GPU is done with it) when the
    /// kernel finishes recording.
    pub fn temp(&self, size: u64) -> Result<BufferRange> {
        let addr = self.dev.alloc.allocate(size, &self.dev.exec)?;
        self.temps.lock().push(addr);
        let r = self.dev.alloc.resolve(addr)?;
        Ok(r.range(size))
    }

    /// A temporary buffer of `size` bytes that every request with the same `name` and size in
    /// this context shares (freed like `temp`): for an intermediate that is dead once the
    /// dispatches recorded with it have run. Work recorded in one context runs in recording
    /// order, so a later user may overwrite it; the tuner records one kernel many times in one
    /// context, and fresh temporaries each time would grow the heap and time the allocator.
    pub fn scratch(&self, name: &'static str, size: u64) -> Result<BufferRange> {
        let mut held = self.scratch.lock();
        if let Some((_, _, r)) = held.iter().find(|(n, s, _)| *n == name && *s == size) {
            return Ok(r.clone());
        }
        let r = self.temp(size)?;
        held.push((name, size, r.clone()));
        Ok(r)
    }

    /// A temporary device tensor of `desc` (freed like `temp`), for kernels that run other
    /// kernels on intermediate tensors (f16 ops computed by an f32 kernel).
    pub fn temp_tensor(&self, desc: TensorDesc) -> Result<DeviceRef> {
        let addr = self
            .dev
            .alloc
            .allocate(desc.byte_size().max(4), &self.dev.exec)?;
        self.temps.lock().push(addr);
        Ok(DeviceRef { desc, addr })
    }

    /// Records one dispatch: `params` at binding 0, `buffers` at 1, 2, ...
    pub fn dispatch(
        &self,
        pipeline: &Pipeline,
        params: &[u8],
        buffers: &[BufferRange],
        groups: [u32; 3],
    ) -> Result<()> {
        self.dev.exec.dispatch(pipeline, params, buffers, groups)
    }

    /// Records a copy between two bindings (`size` a multiple of 4).
    pub fn copy(&self, src: &BufferRange, dst: &BufferRange, size: u64) -> Result<()> {
        crate::kernels::copy::copy_range(self, src, dst, size)
    }

    /// Copies `size` bytes (a multiple of 4) of a binding back to the host, waiting for all
    /// work recorded so far: a blocking call, only for `Kernel::outputs_on_device`.
    pub fn read(&self, src: &BufferRange, size: u64) -> Result<Vec<u8>> {
        if size > src.size {
            return Err(Error::InvalidArgument(format!(
                "a read of {size} bytes from a binding of {} bytes",
                src.size
            )));
        }
        self.dev.exec.read(&src.buffer, src.offset, size)
    }

    /// The device's `ARRIVAL_COUNTERS` u32 counters for kernels whose workgroups count their
    /// arrivals (the cooperative products' split sum in the epilogue, `CoopSpec::sum_last`):
    /// allocated once per device (never freed) and zero-filled in the command stream before
    /// the first dispatch that gets them; every kernel using them leaves them at zero (the
    /// last arrival of each counter resets it). `None` where `count` is more than that.
    pub fn arrival_counters(&self, count: usize) -> Result<Option<DeviceRef>> {
        if count > ARRIVAL_COUNTERS {
            return Ok(None);
        }
        let desc = TensorDesc::new(DType::U32, &[ARRIVAL_COUNTERS]);
        let mut slot = self.dev.arrivals.lock();
        let addr = match *slot {
            Some(addr) => addr,
            None => {
                let size = desc.byte_size();
                let addr = self.dev.alloc.allocate(size, &self.dev.exec)?;
                // (Recorded under the lock: any dispatch that gets the counters is recorded
                // after this clear.)
                let r = self.dev.alloc.resolve(addr)?.range(size);
                self.dev.exec.clear(&r.buffer, r.offset, size)?;
                *slot = Some(addr);
                addr
            }
        };
        Ok(Some(DeviceRef { desc, addr }))
    }

    /// The arrival counters of `arrival_counters` as a buffer range of `words` u32 (at least
    /// one), for kernels that bind ranges (the batch norm's statistics finalized by their last
    /// workgroup); `None` where `words` is more than `ARRIVAL_COUNTERS`.
    pub fn arrivals(&self, words: usize) -> Result<Option<BufferRange>> {
        let Some(c) = self.arrival_counters(words)? else {
            return Ok(None);
        };
        Ok(Some(
            self.dev
                .alloc
                .resolve(c.addr)?
                .range(words.max(1) as u64 * 4),
        ))
    }

    /// Records a zero fill of `size` bytes (a multiple of 4) at a binding.
    pub fn clear(&self, dst: &BufferRange, size: u64) -> Result<()> {
        self.dev.exec.clear(&dst.buffer, dst.offset, size)
    }
}

impl Drop for KernelContext<'_> {
    fn drop(&mut self) {
        let temps = std::mem::take(&mut *self.temps.lock());
        if temps.is_empty() {
            return;
        }
        let tag = self.dev.exec.tag();
        for addr in temps {
            if let Err(e) = self.dev.alloc.free(addr, tag) {
                tracing::error!("freeing a kernel temporary: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_2d_covers_every_group_in_at_most_one_dispatch() {
        let max = MAX_GROUPS_X as usize;
        let what = || "rows".to_string();
        assert_eq!(grid_2d(0, what).unwrap(), (1, 0));
        assert_eq!(grid_2d(5, what).unwrap(), (5, 1));
        assert_eq!(grid_2d(max, what).unwrap(), (max, 1));
        assert_eq!(grid_2d(max + 1, what).unwrap(), (max, 2));
        assert_eq!(grid_2d(max * max, what).unwrap(), (max, max));
        let e = grid_2d(max * max + 1, what).unwrap_err().to_string();
        assert!(
            e.contains("rows are more than one dispatch can cover"),
            "{e}"
        );
    }
}
