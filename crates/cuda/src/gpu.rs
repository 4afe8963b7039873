//! One device: its context and stream, the compiled kernels, buffers, and a launcher per kernel.
//!
//! Launchers take raw device addresses ([`DevPtr`]) so that the forward pass can point into
//! parts of its buffers without juggling borrows; they are `unsafe`, and each says what the
//! caller must guarantee (buffers as large as the shapes say, alive until the stream has run).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};
use onebit_gguf::GgmlType;

use crate::CudaError;
use crate::compile::ptx_for;

/// A device address (of a buffer, or a place inside one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DevPtr(pub u64);

impl DevPtr {
    pub const NULL: DevPtr = DevPtr(0);

    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevPtr {
        DevPtr(self.0 + bytes as u64)
    }
}

/// A buffer of `T`s in device memory.
pub struct Buf<T> {
    slice: CudaSlice<T>,
    ptr: DevPtr,
}

impl<T: DeviceRepr> Buf<T> {
    fn new(slice: CudaSlice<T>, stream: &CudaStream) -> Buf<T> {
        let raw = slice.device_ptr(stream).0;
        Buf { ptr: DevPtr(raw), slice }
    }

    pub fn len(&self) -> usize {
        self.slice.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slice.is_empty()
    }

    /// The address of element `i`.
    pub fn at(&self, i: usize) -> DevPtr {
        assert!(i <= self.len(), "element {i} of a buffer of {}", self.len());
        self.ptr.offset(i * std::mem::size_of::<T>())
    }

    pub fn ptr(&self) -> DevPtr {
        self.ptr
    }
}

/// How [`Gpu::attention`] cuts each (token, head)'s positions: `splits` chunks of `chunk`,
/// their partial results in `part`.
#[derive(Clone, Copy, Debug)]
pub struct AttnSplit {
    pub splits: usize,
    pub chunk: usize,
    pub part: DevPtr,
}

/// Launches recorded by [`Gpu::capture`].
pub struct Graph(cudarc::driver::CudaGraph);

// SAFETY: a graph is a pair of driver handles; the driver API may be called on them from any
// thread (cudarc binds the context before each call), and `&mut`/owned use keeps two threads
// from launching or dropping one graph at once. Only `Send` is claimed, not `Sync`.
unsafe impl Send for Graph {}

impl Graph {
    /// Run the recorded launches on the device's stream.
    pub fn launch(&self) -> Result<(), CudaError> {
        Ok(self.0.launch()?)
    }
}

/// Activations rounded for the Q1_0 products: int8 values, and per block of 32 a scale and
/// the values' sum.
#[derive(Clone, Copy, Debug)]
pub struct Acts {
    pub q: DevPtr,
    pub d: DevPtr,
    pub s: DevPtr,
}

impl Acts {
    /// Bytes of each part for `n` rows of `cols`: (values, scales, sums).
    pub fn bytes(n: usize, cols: usize) -> (usize, usize, usize) {
        (n * cols, n * cols / 32 * 4, n * cols / 32 * 4)
    }

    /// The parts laid out one after another from `base` (16-byte aligned), for `n` rows.
    pub fn at(base: DevPtr, n: usize, cols: usize) -> Acts {
        let (q, d, _) = Acts::bytes(n, cols);
        let d_at = q.next_multiple_of(16);
        Acts { q: base, d: base.offset(d_at), s: base.offset(d_at + d) }
    }

    /// Room for [`Acts::at`]'s layout.
    pub fn total_bytes(n: usize, cols: usize) -> usize {
        let (q, d, s) = Acts::bytes(n, cols);
        q.next_multiple_of(16) + d + s
    }

    /// The same parts from token `t` on.
    fn token(self, t: usize, cols: usize) -> Acts {
        Acts { q: self.q.offset(t * cols), d: self.d.offset(t * cols / 32 * 4), s: self.s.offset(t * cols / 32 * 4) }
    }
}

/// Q1_0 rows as the GPU products read them: every row's sign bits (16 bytes per block of
/// 128), then every row's f16 scales, so that a warp's loads are contiguous. `data` holds
/// `rows` rows of `cols` weights in the file's layout (18-byte blocks).
pub fn q1_split(data: &[u8], rows: usize, cols: usize) -> Result<Vec<u8>, CudaError> {
    check_q1(cols)?;
    let nb = cols / 128;
    if data.len() != rows * nb * 18 {
        return Err(CudaError::Shape(format!("{} bytes for {rows} Q1_0 rows of {cols}", data.len())));
    }
    let mut out = vec![0u8; data.len()];
    let (bits, scales) = out.split_at_mut(rows * nb * 16);
    for (i, block) in data.chunks_exact(18).enumerate() {
        scales[2 * i..2 * i + 2].copy_from_slice(&block[..2]);
        bits[16 * i..16 * i + 16].copy_from_slice(&block[2..]);
    }
    Ok(out)
}

fn check_q1(cols: usize) -> Result<(), CudaError> {
    if !cols.is_multiple_of(128) {
        return Err(CudaError::Shape(format!("Q1_0 rows of {cols} weights")));
    }
    Ok(())
}

/// One warp per row, four to a block.
fn warp_rows(rows: usize) -> Result<LaunchConfig, CudaError> {
    Ok(LaunchConfig { grid_dim: (u32_arg(rows.div_ceil(4))?, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 })
}

/// The token counts the Q1_0 kernels are compiled for.
const Q1_TOKENS: [usize; 4] = [1, 2, 4, 8];

/// The narrowest Q1_0 kernel that takes `n` tokens.
fn q1_width(n: usize) -> usize {
    Q1_TOKENS.into_iter().find(|&w| w >= n).unwrap_or(MATVEC_TOKENS)
}

/// The element types a KV cache can hold on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvElem {
    F16,
    F32,
}

/// The kernel-name suffix of each format the GPU multiplies.
pub(crate) fn format_name(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        F32 => "f32",
        F16 => "f16",
        BF16 => "bf16",
        Q4_0 => "q4_0",
        Q4_1 => "q4_1",
        Q5_0 => "q5_0",
        Q5_1 => "q5_1",
        Q8_0 => "q8_0",
        Q2_K => "q2_k",
        Q3_K => "q3_k",
        Q4_K => "q4_k",
        Q5_K => "q5_k",
        Q6_K => "q6_k",
        TQ1_0 => "tq1_0",
        TQ2_0 => "tq2_0",
        Q1_0 => "q1_0",
        Q2_0 => "q2_0",
        _ => return None,
    })
}

/// Tokens one product launch takes (the kernels' MAX_TOKENS).
pub const MATVEC_TOKENS: usize = 8;
const MATVEC_WARPS: u32 = 4;
const ATTN_THREADS: u32 = 128;
/// The widest head the attention kernel takes (its MAX_HEAD).
pub const MAX_HEAD: usize = 256;

/// An open device with the kernels loaded.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    _module: Arc<CudaModule>,
    functions: HashMap<String, CudaFunction>,
    name: String,
    capability: (i32, i32),
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({}, sm_{}{})", self.name, self.capability.0, self.capability.1)
    }
}

fn u32_arg(n: usize) -> Result<u32, CudaError> {
    u32::try_from(n).map_err(|_| CudaError::Shape(format!("{n} is too large for a launch")))
}

fn i32_arg(n: usize) -> Result<i32, CudaError> {
    i32::try_from(n).map_err(|_| CudaError::Shape(format!("{n} is too large for a kernel argument")))
}

impl Gpu {
    /// Open device `ordinal` and compile (or load from the cache) the kernels for it.
    pub fn open(ordinal: usize) -> Result<Gpu, CudaError> {
        // SAFETY: only looks for the library by name (dlopen); cudarc panics on first use
        // without it, so nothing below may run unless it is there.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        let count = CudaContext::device_count()? as usize;
        if ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal)?;
        // One stream runs everything in order: the per-buffer events that order work across
        // streams would only cost time (and cannot be captured into graphs).
        // SAFETY: called before any buffer exists, and this crate uses a single stream.
        unsafe { ctx.disable_event_tracking() };
        let capability = ctx.compute_capability()?;
        let name = ctx.name()?;
        let module = ctx.load_module(ptx_for(capability.0, capability.1)?)?;
        // A stream of its own: the legacy default stream cannot be captured into graphs.
        let stream = ctx.new_stream()?;
        let mut functions = HashMap::new();
        let mut names: Vec<String> = ["rms_norm", "silu_mul", "quantize_acts", "attention_combine", "round_acts"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        for elem in ["f16", "f32"] {
            names.extend([format!("qk_rope_store_{elem}"), format!("attention_{elem}")]);
        }
        for nt in Q1_TOKENS {
            names.extend([format!("q1_matvec_{nt}"), format!("q1_glu_{nt}")]);
        }
        for ty in GgmlType::ALL {
            if let Some(f) = format_name(*ty) {
                names.extend([format!("matvec_{f}"), format!("dequant_rows_{f}")]);
            }
        }
        for n in names {
            functions.insert(n.clone(), module.load_function(&n)?);
        }
        Ok(Gpu { ctx, stream, _module: module, functions, name, capability })
    }

    /// The device's name, as the driver gives it.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    pub fn capability(&self) -> (i32, i32) {
        self.capability
    }

    /// Free and total device memory, in bytes.
    pub fn memory(&self) -> Result<(usize, usize), CudaError> {
        Ok(self.ctx.mem_get_info()?)
    }

    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<Buf<T>, CudaError> {
        Ok(Buf::new(self.stream.clone_htod(data)?, &self.stream))
    }

    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<Buf<T>, CudaError> {
        Ok(Buf::new(self.stream.alloc_zeros(n.max(1))?, &self.stream))
    }

    /// Copy `data` into `buf` from element 0 (the stream orders it before later launches).
    pub fn write<T: DeviceRepr>(&self, buf: &mut Buf<T>, data: &[T]) -> Result<(), CudaError> {
        if data.len() > buf.len() {
            return Err(CudaError::Shape(format!("{} values into a buffer of {}", data.len(), buf.len())));
        }
        let mut view = buf.slice.slice_mut(..data.len());
        self.stream.memcpy_htod(data, &mut view)?;
        Ok(())
    }

    /// Copy the first `out.len()` elements of `buf` back, waiting for the stream.
    pub fn read<T: DeviceRepr>(&self, buf: &Buf<T>, out: &mut [T]) -> Result<(), CudaError> {
        if out.len() > buf.len() {
            return Err(CudaError::Shape(format!("{} values out of a buffer of {}", out.len(), buf.len())));
        }
        self.stream.memcpy_dtoh(&buf.slice.slice(..out.len()), out)?;
        self.stream.synchronize()?;
        Ok(())
    }

    /// Record the launches `record` makes on this device's stream (without running them) as
    /// a graph, replayed later with one call: the launch costs of a decode step, paid once.
    /// The graph keeps the addresses and shapes it was recorded with.
    pub fn capture(&self, record: impl FnOnce() -> Result<(), CudaError>) -> Result<Graph, CudaError> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        self.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let recorded = record();
        let graph = self.stream.end_capture(CUgraphInstantiate_flags(0))?;
        recorded?;
        graph.map(Graph).ok_or_else(|| CudaError::Shape("an empty graph".into()))
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        Ok(self.stream.synchronize()?)
    }

    fn function(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.functions.get(name).ok_or_else(|| CudaError::Compile(format!("kernel {name} is missing")))
    }

    /// `y[t][r] (+)= Σ_c w[r][c] · x[t][c]` for `n_tok` tokens: `w` is `rows` rows of `cols`
    /// weights of type `ty` (the file's bytes), `x` and `y` f32, token rows of `y` `ldy` apart.
    /// For Q4_1/Q5_1, `sums` (unless NULL) holds [`Gpu::round_acts`]'s per-32 sums of `x`, and
    /// each block's min is applied to them, as llama.cpp does.
    ///
    /// # Safety
    /// `w`, `x` and `y` must point to live device buffers of at least `rows` rows of `ty`,
    /// `n_tok × cols` and `(n_tok - 1) × ldy + rows` floats, and `y` must not overlap `w` or `x`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn matvec(
        &self,
        ty: GgmlType,
        w: DevPtr,
        rows: usize,
        cols: usize,
        x: DevPtr,
        sums: DevPtr,
        n_tok: usize,
        y: DevPtr,
        ldy: usize,
        add: bool,
    ) -> Result<(), CudaError> {
        let f = self.function(&format!("matvec_{}", format_name(ty).ok_or(CudaError::Unsupported(ty))?))?;
        if !cols.is_multiple_of(8) {
            return Err(CudaError::Shape(format!("rows of {cols} weights (the GPU needs multiples of 8)")));
        }
        let row_bytes = ty.bytes_for(cols as u64).ok_or_else(|| CudaError::Shape(format!("{ty} rows of {cols}")))?;
        let (rows_arg, cols_arg, ldy_arg, add_arg) = (i32_arg(rows)?, i32_arg(cols)?, i32_arg(ldy)?, add as i32);
        let row_bytes = row_bytes as i64;
        let cfg = LaunchConfig {
            grid_dim: (u32_arg(rows.div_ceil(MATVEC_WARPS as usize))?, 1, 1),
            block_dim: (32 * MATVEC_WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        for t0 in (0..n_tok).step_by(MATVEC_TOKENS) {
            let n = (n_tok - t0).min(MATVEC_TOKENS) as i32;
            let (xt, yt) = (x.offset(t0 * cols * 4).0, y.offset(t0 * ldy * 4).0);
            let st = if sums == DevPtr::NULL { 0 } else { sums.offset(t0 * cols / 32 * 4).0 };
            let mut b = self.stream.launch_builder(f);
            b.arg(&w.0)
                .arg(&row_bytes)
                .arg(&rows_arg)
                .arg(&cols_arg)
                .arg(&xt)
                .arg(&st)
                .arg(&n)
                .arg(&yt)
                .arg(&ldy_arg)
                .arg(&add_arg);
            // SAFETY: the caller vouches for the buffers; the grid covers `rows` and the
            // kernel reads `n` tokens of `cols`.
            unsafe { b.launch(cfg) }?;
        }
        Ok(())
    }

    /// `out[i] = w[ids[i]]`, rows of `cols` weights of type `ty` widened to f32.
    ///
    /// # Safety
    /// `w` must hold every row `ids` names, `ids` `n_ids` ints and `out` `n_ids × cols` floats.
    pub unsafe fn dequant_rows(
        &self,
        ty: GgmlType,
        w: DevPtr,
        cols: usize,
        ids: DevPtr,
        n_ids: usize,
        out: DevPtr,
    ) -> Result<(), CudaError> {
        let f = self.function(&format!("dequant_rows_{}", format_name(ty).ok_or(CudaError::Unsupported(ty))?))?;
        if !cols.is_multiple_of(8) {
            return Err(CudaError::Shape(format!("rows of {cols} weights (the GPU needs multiples of 8)")));
        }
        let row_bytes = ty.bytes_for(cols as u64).ok_or_else(|| CudaError::Shape(format!("{ty} rows of {cols}")))?;
        let (row_bytes, cols_arg) = (row_bytes as i64, i32_arg(cols)?);
        let cfg = LaunchConfig {
            grid_dim: (u32_arg(cols.div_ceil(8 * 128))?, u32_arg(n_ids)?, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&w.0).arg(&row_bytes).arg(&cols_arg).arg(&ids.0).arg(&out.0);
        // SAFETY: the caller vouches for the buffers; the grid covers `cols` and `n_ids`.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `out[i] = x[rows[i]] / rms(x[rows[i]]) · w` (rows 0.. when `rows` is NULL).
    ///
    /// # Safety
    /// `x` must hold every row read, `w` `cols` floats, `rows` (unless NULL) `n` ints, and
    /// `out` `n × cols` floats not overlapping `x` unless equal to it row for row.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rms_norm(
        &self,
        x: DevPtr,
        w: DevPtr,
        eps: f32,
        rows: DevPtr,
        n: usize,
        out: DevPtr,
        cols: usize,
    ) -> Result<(), CudaError> {
        let cols_arg = i32_arg(cols)?;
        let cfg = LaunchConfig { grid_dim: (u32_arg(n)?, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(self.function("rms_norm")?);
        b.arg(&x.0).arg(&w.0).arg(&eps).arg(&rows.0).arg(&out.0).arg(&cols_arg);
        // SAFETY: the caller vouches for the buffers; one block per row.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// For the q/k/v rows of `n_tok` tokens (`qkv`, token rows `ld` floats apart: queries,
    /// keys, values): add biases, RMS-norm q and k per head, apply RoPE (`cs`: per token
    /// `rope_dims / 2` cosines then as many sines); queries stay in place, keys and values
    /// (plus the value bias) go to the cache slots `slots` names (`block × 16 + position in
    /// block`). NULL skips a bias or a norm.
    ///
    /// # Safety
    /// `qkv` holds `n_tok` rows of `ld >= (n_heads + n_kv_heads) × head_dim + n_kv_heads ×
    /// value_dim` floats, biases and norms their shapes, `cs` `n_tok × rope_dims` floats,
    /// `slots` `n_tok` ints each naming a block inside `cache` (one layer's keys and values,
    /// [block][kv head][16][dim] of `elem`).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn qk_rope_store(
        &self,
        elem: KvElem,
        qkv: DevPtr,
        ld: usize,
        biases: [DevPtr; 3],
        norms: (DevPtr, DevPtr),
        eps: f32,
        cs: DevPtr,
        slots: DevPtr,
        cache: (DevPtr, DevPtr),
        n_tok: usize,
        heads: (usize, usize),
        dims: (usize, usize),
        rope_dims: usize,
        neox: bool,
    ) -> Result<(), CudaError> {
        if dims.0 > 512 || rope_dims > dims.0 {
            return Err(CudaError::Shape(format!("heads of {} (rotating {rope_dims}) on the GPU", dims.0)));
        }
        let name = match elem {
            KvElem::F16 => "qk_rope_store_f16",
            KvElem::F32 => "qk_rope_store_f32",
        };
        let (ld, nh, nkv) = (i32_arg(ld)?, i32_arg(heads.0)?, i32_arg(heads.1)?);
        let (hd, vd, rd, nx) = (i32_arg(dims.0)?, i32_arg(dims.1)?, i32_arg(rope_dims)?, neox as i32);
        let cfg = LaunchConfig {
            grid_dim: (u32_arg(n_tok)?, u32_arg(heads.0 + heads.1)?, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(self.function(name)?);
        b.arg(&qkv.0).arg(&ld).arg(&biases[0].0).arg(&biases[1].0).arg(&biases[2].0).arg(&norms.0.0).arg(&norms.1.0);
        b.arg(&eps).arg(&cs.0).arg(&slots.0).arg(&cache.0.0).arg(&cache.1.0);
        b.arg(&nh).arg(&nkv).arg(&hd).arg(&vd).arg(&rd).arg(&nx);
        // SAFETY: the caller vouches for the buffers; one block per (token, head).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Round `n` token rows of `x` (picked by `rows` unless NULL; RMS-normed by `norm` first
    /// unless NULL) to int8 blocks of 32 for the Q1_0 products.
    ///
    /// # Safety
    /// `x` holds every row read (of `cols` floats), `norm` `cols` floats, `rows` `n` ints,
    /// `out` room for `n` rows (see [`Gpu::acts_bytes`]).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn quantize_acts(
        &self,
        x: DevPtr,
        norm: DevPtr,
        eps: f32,
        rows: DevPtr,
        n: usize,
        cols: usize,
        out: Acts,
    ) -> Result<(), CudaError> {
        if !cols.is_multiple_of(32) {
            return Err(CudaError::Shape(format!("activations of {cols} (the GPU rounds blocks of 32)")));
        }
        let cols_arg = i32_arg(cols)?;
        let cfg = LaunchConfig {
            grid_dim: (u32_arg(n)?, u32_arg(cols.div_ceil(32 * 8))?, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(self.function("quantize_acts")?);
        b.arg(&x.0).arg(&norm.0).arg(&eps).arg(&rows.0).arg(&cols_arg).arg(&out.q.0).arg(&out.d.0).arg(&out.s.0);
        // SAFETY: the caller vouches for the buffers; one block per row.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `y[t][r] (+)= Σ_c w[r][c] · x[t][c]` for Q1_0 rows and rounded activations.
    ///
    /// # Safety
    /// `w` holds `rows` Q1_0 rows of `cols` in the split layout of [`q1_split`], `acts` `n_tok` rounded rows of `cols`, `y`
    /// `(n_tok - 1) × ldy + rows` floats.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn q1_matvec(
        &self,
        w: DevPtr,
        rows: usize,
        cols: usize,
        acts: Acts,
        n_tok: usize,
        y: DevPtr,
        ldy: usize,
        add: bool,
    ) -> Result<(), CudaError> {
        check_q1(cols)?;
        let (rows_arg, cols_arg, ldy_arg, add_arg) = (i32_arg(rows)?, i32_arg(cols)?, i32_arg(ldy)?, add as i32);
        for t0 in (0..n_tok).step_by(MATVEC_TOKENS) {
            let n = (n_tok - t0).min(MATVEC_TOKENS);
            let f = self.function(&format!("q1_matvec_{}", q1_width(n)))?;
            let n = n as i32;
            let a = acts.token(t0, cols);
            let yt = y.offset(t0 * ldy * 4).0;
            let mut b = self.stream.launch_builder(f);
            b.arg(&w.0).arg(&rows_arg).arg(&cols_arg).arg(&a.q.0).arg(&a.d.0).arg(&a.s.0);
            b.arg(&n).arg(&yt).arg(&ldy_arg).arg(&add_arg);
            // SAFETY: the caller vouches for the buffers; one warp per row.
            unsafe { b.launch(warp_rows(rows)?) }?;
        }
        Ok(())
    }

    /// `y[t][r] = silu(gate[r] · x[t]) · (up[r] · x[t])` for Q1_0 gate and up rows.
    ///
    /// # Safety
    /// As [`Gpu::q1_matvec`] for both matrices, `y` `n_tok × rows` floats.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn q1_glu(
        &self,
        gate: DevPtr,
        up: DevPtr,
        rows: usize,
        cols: usize,
        acts: Acts,
        n_tok: usize,
        y: DevPtr,
    ) -> Result<(), CudaError> {
        check_q1(cols)?;
        let (rows_arg, cols_arg) = (i32_arg(rows)?, i32_arg(cols)?);
        for t0 in (0..n_tok).step_by(MATVEC_TOKENS) {
            let n = (n_tok - t0).min(MATVEC_TOKENS);
            let f = self.function(&format!("q1_glu_{}", q1_width(n)))?;
            let n = n as i32;
            let a = acts.token(t0, cols);
            let yt = y.offset(t0 * rows * 4).0;
            let mut b = self.stream.launch_builder(f);
            b.arg(&gate.0).arg(&up.0).arg(&rows_arg).arg(&cols_arg).arg(&a.q.0).arg(&a.d.0);
            b.arg(&a.s.0).arg(&n).arg(&yt);
            // SAFETY: the caller vouches for the buffers; one warp per row.
            unsafe { b.launch(warp_rows(rows)?) }?;
        }
        Ok(())
    }

    /// Causal attention of `n_tok` tokens' query heads over their sequences' cached positions:
    /// token `t` reads `n_keys[t]` positions through the block table at `tables + table_at[t]`.
    ///
    /// With `split`, each (token, head) is cut into chunks of positions taken by blocks of
    /// their own (flash-decoding: a few long sequences still fill the device), then merged.
    ///
    /// # Safety
    /// `q` holds `n_tok` rows (`ld` floats apart) of `n_heads × head_dim` floats, `split`'s
    /// `part` `n_tok × n_heads × splits × (value_dim + 2)` floats, `out` `n_tok × n_heads × value_dim`, the
    /// int arrays `n_tok` entries each, every table entry a block inside the cache.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attention(
        &self,
        elem: KvElem,
        q: DevPtr,
        ld: usize,
        cache: (DevPtr, DevPtr),
        tables: DevPtr,
        table_at: DevPtr,
        n_keys: DevPtr,
        out: DevPtr,
        n_tok: usize,
        heads: (usize, usize),
        dims: (usize, usize),
        split: Option<AttnSplit>,
    ) -> Result<(), CudaError> {
        let ld = i32_arg(ld)?;
        if dims.0 > MAX_HEAD || dims.1 > MAX_HEAD || heads.1 == 0 || !heads.0.is_multiple_of(heads.1) {
            return Err(CudaError::Shape(format!("attention over heads of {dims:?} ({heads:?} heads) on the GPU")));
        }
        let name = match elem {
            KvElem::F16 => "attention_f16",
            KvElem::F32 => "attention_f32",
        };
        let (nh, nkv, hd, vd) = (i32_arg(heads.0)?, i32_arg(heads.1)?, i32_arg(dims.0)?, i32_arg(dims.1)?);
        let scale = 1.0 / (dims.0 as f32).sqrt();
        let (splits, chunk, part) = match split {
            Some(s) => (s.splits, i32_arg(s.chunk)?, s.part),
            None => (1, i32::MAX, DevPtr::NULL),
        };
        let cfg = LaunchConfig {
            grid_dim: (u32_arg(n_tok)?, u32_arg(heads.0)?, u32_arg(splits)?),
            block_dim: (ATTN_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(self.function(name)?);
        b.arg(&q.0).arg(&ld).arg(&cache.0.0).arg(&cache.1.0).arg(&tables.0).arg(&table_at.0).arg(&n_keys.0).arg(&out.0);
        b.arg(&part.0).arg(&chunk).arg(&nh).arg(&nkv).arg(&hd).arg(&vd).arg(&scale);
        // SAFETY: the caller vouches for the buffers; one block per (token, query head, chunk).
        unsafe { b.launch(cfg) }?;
        if split.is_some() {
            let cfg = LaunchConfig {
                grid_dim: (u32_arg(n_tok)?, u32_arg(heads.0)?, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let splits_arg = i32_arg(splits)?;
            let mut b = self.stream.launch_builder(self.function("attention_combine")?);
            b.arg(&part.0).arg(&out.0).arg(&nh).arg(&splits_arg).arg(&vd);
            // SAFETY: `part` was just written for these shapes (the caller vouches for its size).
            unsafe { b.launch(cfg) }?;
        }
        Ok(())
    }

    /// `out = x` rounded as llama.cpp's CPU rounds activations for weights of type `ty` (Q8_0
    /// or Q8_K blocks, dequantized back), so that products match its reference; f32 for float
    /// weights. Returns whether it rounded (else `out` was not written).
    ///
    /// For Q4_1/Q5_1 (Q8_1 activations) it also writes each block's sum, as the f16 the
    /// reference keeps, into `sums` (unless NULL).
    ///
    /// # Safety
    /// `x` and `out` hold `n` floats (`out` may equal `x`), `sums` `n / 32`.
    pub unsafe fn round_acts(
        &self,
        ty: GgmlType,
        x: DevPtr,
        out: DevPtr,
        sums: DevPtr,
        n: usize,
    ) -> Result<bool, CudaError> {
        use GgmlType::*;
        let (mode, block) = match ty {
            F32 | F16 | BF16 => return Ok(false),
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | TQ1_0 | TQ2_0 => (1i32, 256),
            _ => (0i32, 32),
        };
        if !n.is_multiple_of(block) {
            return Err(CudaError::Shape(format!("{n} activations in blocks of {block}")));
        }
        let n_blocks = (n / block) as i64;
        let cfg = LaunchConfig {
            grid_dim: (u32_arg((n / block).div_ceil(8))?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(self.function("round_acts")?);
        let sums = if matches!(ty, Q4_1 | Q5_1) { sums } else { DevPtr::NULL };
        b.arg(&x.0).arg(&out.0).arg(&sums.0).arg(&n_blocks).arg(&mode);
        // SAFETY: the caller vouches for the buffers; one warp per block.
        unsafe { b.launch(cfg) }?;
        Ok(true)
    }

    /// `g = silu(g) · u` over `n` floats.
    ///
    /// # Safety
    /// `g` and `u` must hold `n` floats each.
    pub unsafe fn silu_mul(&self, g: DevPtr, u: DevPtr, n: usize) -> Result<(), CudaError> {
        let n_arg = n as i64;
        let cfg = LaunchConfig {
            grid_dim: (u32_arg(n.div_ceil(256).clamp(1, 4096))?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(self.function("silu_mul")?);
        b.arg(&g.0).arg(&u.0).arg(&n_arg);
        // SAFETY: the caller vouches for the buffers; the kernel strides over `n`.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}
