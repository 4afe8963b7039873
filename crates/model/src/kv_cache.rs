//! The paged key/value cache.
//!
//! Keys and values live in one [`KvPool`] per model: fixed-size blocks of [`BLOCK_TOKENS`]
//! positions, each holding those positions for every layer and kv head. A sequence owns a block
//! table (block `i` holds its positions `i·BLOCK_TOKENS ..`), so sequences can share blocks of a
//! common prefix, and a sequence's memory grows a block at a time. Attention reads the blocks
//! where they lie, through the table.
//!
//! Storage per layer is `[superblock][kv head][block in superblock][position in block][dim]`,
//! a superblock being [`SUPER_BLOCKS`] consecutive blocks: one head's positions of a block are
//! contiguous, and so are those of consecutive blocks of a superblock, so that attention reads
//! a sequence whose blocks follow each other in long runs the hardware streams (rather than a
//! few KiB here and there). A block's rows still lie within its superblock's span of each
//! layer, so writing a block makes resident about as much of the pool as before. The pool is
//! allocated zeroed and lazily by the OS: pages of blocks never written are never resident.
//!
//! Rows are kept as IEEE halves (llama.cpp's default), f32, or Q8_0 blocks (34 bytes per 32
//! values, about half the bytes of f16 for attention to read; quantized the way llama.cpp's
//! CPU backend quantizes a Q8_0 cache).
//!
//! A model with sliding-window layers (Gemma 3) may keep those layers in a part of the pool with
//! blocks of its own ([`KvPool::new_split`]): a sequence then has a second table for them, whose
//! blocks below what the window still reads ([`Config::window_reads_from`]) are given back as
//! it advances ([`NO_BLOCK`] in their place), so that a long context holds only its global
//! layers' keys and values in full.
//!
//! [`KvCache`] is the simple form for one sequence alone: a private pool and its table.

use std::str::FromStr;

use onebit_kernels::arena::Arena;
use onebit_kernels::formats::BlockQ8_0;
use onebit_kernels::{DisjointRows, Kernels};

use crate::config::Config;
use crate::error::ModelError;

/// Positions per block.
pub const BLOCK_TOKENS: usize = 16;

/// A window table's entry for a block given back (below what the window layers still read).
pub const NO_BLOCK: u32 = u32::MAX;

/// Blocks per superblock (see the module's notes on storage).
pub(crate) const SUPER_BLOCKS: usize = 64;

/// Row (of one head's keys or values at one position) of `slot` of kv head `head` in `block`,
/// in a layer of a pool of `n_blocks` blocks and `n_kv_heads` heads.
fn row_index(n_blocks: usize, n_kv_heads: usize, block: usize, head: usize, slot: usize) -> usize {
    let first = block / SUPER_BLOCKS * SUPER_BLOCKS;
    let span = (n_blocks - first).min(SUPER_BLOCKS);
    (first * n_kv_heads + head * span + (block - first)) * BLOCK_TOKENS + slot
}

/// How cached keys and values are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    /// IEEE half, as llama.cpp stores them by default.
    #[default]
    F16,
    F32,
    /// 8-bit blocks of 32 with an f16 scale (head sizes must be multiples of 32).
    Q8_0,
}

impl KvType {
    /// Whether this model's heads can be stored in this type.
    pub fn check(self, config: &Config) -> Result<(), ModelError> {
        if self == KvType::Q8_0 && (!config.head_dim.is_multiple_of(32) || !config.value_dim.is_multiple_of(32)) {
            return Err(ModelError::Unsupported(format!(
                "a q8_0 KV cache needs head sizes that are multiples of 32 (this model's are {} and {}); use f16",
                config.head_dim, config.value_dim
            )));
        }
        if self == KvType::Q8_0 && config.head_dim > onebit_kernels::MAX_HEAD {
            return Err(ModelError::Unsupported(format!(
                "a q8_0 KV cache takes keys of up to {} values (this model's are {}); use f16",
                onebit_kernels::MAX_HEAD,
                config.head_dim
            )));
        }
        Ok(())
    }

    /// Bytes of `n` cached values.
    fn bytes(self, n: usize) -> usize {
        match self {
            KvType::F16 => 2 * n,
            KvType::F32 => 4 * n,
            KvType::Q8_0 => n / 32 * Q8_BLOCK_BYTES,
        }
    }
}

impl FromStr for KvType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "f32" => Ok(KvType::F32),
            "q8_0" | "q8" => Ok(KvType::Q8_0),
            _ => Err(format!("unknown KV cache type '{s}' (known: f16, f32, q8_0)")),
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
            KvType::Q8_0 => "q8_0",
        })
    }
}

/// Borrowed cached rows of keys or values (consecutive positions of one head in one block).
#[derive(Clone, Copy)]
pub enum KvRow<'a> {
    F16(&'a [u16]),
    F32(&'a [f32]),
    Q8_0(&'a [u8]),
}

const Q8_BLOCK_BYTES: usize = std::mem::size_of::<BlockQ8_0>();

/// The blocks of keys and values every sequence of a model draws from.
///
/// One allocation holds them all, layer after layer (the keys of a layer, then its values):
/// aligned to and advised for 2 MiB pages, so that pages touched for the first time while
/// sequences decode cost one fault per 2 MiB rather than one per 4 KiB.
pub struct KvPool {
    buf: Storage,
    layers: Vec<LayerStore>,
    n_blocks: usize,
    /// Blocks of the sliding-window layers (`n_blocks` in a pool that is not split).
    n_window_blocks: usize,
    n_kv_heads: usize,
    head_dim: usize,
    value_dim: usize,
    kv_type: KvType,
}

/// Where one layer's keys and values lie in a pool, and how many blocks they have.
#[derive(Clone, Copy, Debug)]
struct LayerStore {
    /// Byte offset of the keys; the values follow them.
    at: usize,
    k_bytes: usize,
    v_bytes: usize,
    n_blocks: usize,
    /// A sliding-window layer's (read through the window tables).
    sliding: bool,
}

/// Where a pool's bytes live.
pub(crate) enum Storage {
    /// Zeroed, 2 MiB aligned, in huge pages, untouched until written.
    Host(Arena),
    /// On the GPU the model runs on.
    Device(onebit_cuda::Buf<u8>),
}

impl Storage {
    fn len(&self) -> usize {
        match self {
            Storage::Host(a) => a.len(),
            Storage::Device(b) => b.len(),
        }
    }
}

impl std::fmt::Debug for KvPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KvPool({} blocks of {BLOCK_TOKENS}", self.n_blocks)?;
        if self.n_window_blocks != self.n_blocks {
            write!(f, ", {} for the window layers", self.n_window_blocks)?;
        }
        write!(f, ", {})", self.kv_type)
    }
}

/// A host pool's zeroed bytes: per layer, a region of keys then one of values. Huge pages
/// except for each region's first superblock: a sequence's first token writes one row into it
/// per layer and head, which with huge pages would fault in (and zero) 2 MiB per layer and kind
/// at once, a large part of a first token's time. Attention over long contexts reads the rest
/// in long runs, where huge pages save TLB misses.
fn host_arena(total: usize, layers: &[LayerStore]) -> Option<Arena> {
    let arena = Arena::try_zeroed_paged(total, false)?;
    for l in layers {
        let first = SUPER_BLOCKS.min(l.n_blocks);
        for (at, size) in [(l.at, l.k_bytes), (l.at + l.k_bytes, l.v_bytes)] {
            arena.advise_huge(at + size / l.n_blocks.max(1) * first..at + size);
        }
    }
    Some(arena)
}

impl KvPool {
    /// Bytes a pool of `n_blocks` blocks (and `n_window_blocks` for the sliding-window layers,
    /// as [`KvPool::new_split`] takes them) takes for `config`'s model.
    pub fn bytes_for(config: &Config, kv_type: KvType, n_blocks: usize, n_window_blocks: usize) -> u128 {
        let per_layer = kv_type.bytes(config.n_kv_heads * BLOCK_TOKENS * (config.head_dim + config.value_dim));
        (0..config.n_layers)
            .map(|l| per_layer as u128 * if config.window(l).is_some() { n_window_blocks } else { n_blocks } as u128)
            .sum()
    }

    /// A pool of `n_blocks` blocks. The memory is reserved, not touched: it becomes resident
    /// as blocks are written. Fails (rather than aborting) when it cannot be reserved.
    pub fn new(config: &Config, n_blocks: usize, kv_type: KvType) -> Result<KvPool, ModelError> {
        KvPool::new_on(config, [n_blocks; 2], kv_type, None)
    }

    /// A pool of `n_blocks` blocks for the layers that attend to every position, and
    /// `n_window_blocks` of their own for the sliding-window layers: sequences then give the
    /// latter a table of their own ([`crate::SeqInput::window_blocks`]).
    pub fn new_split(
        config: &Config,
        n_blocks: usize,
        n_window_blocks: usize,
        kv_type: KvType,
    ) -> Result<KvPool, ModelError> {
        KvPool::new_on(config, [n_blocks, n_window_blocks], kv_type, None)
    }

    /// A pool in host memory, or (with `gpu`, not split) in that device's memory; `blocks`:
    /// the blocks of the global layers and those of the sliding-window layers.
    pub(crate) fn new_on(
        config: &Config,
        blocks: [usize; 2],
        kv_type: KvType,
        gpu: Option<&onebit_cuda::Gpu>,
    ) -> Result<KvPool, ModelError> {
        kv_type.check(config)?;
        let [n_blocks, n_window_blocks] = blocks;
        let too_big = || ModelError::OutOfMemory {
            what: format!("a KV cache of {n_blocks} blocks of {BLOCK_TOKENS} positions"),
            bytes: KvPool::bytes_for(config, kv_type, n_blocks, n_window_blocks).min(u64::MAX as u128) as u64,
        };
        let bytes = |dim: usize, n: usize| {
            (config.n_kv_heads * BLOCK_TOKENS * dim).checked_mul(n).map(|n| kv_type.bytes(n)).ok_or_else(too_big)
        };
        let mut layers = Vec::with_capacity(config.n_layers);
        let mut total = 0usize;
        for l in 0..config.n_layers {
            let sliding = config.window(l).is_some();
            let n = if sliding { n_window_blocks } else { n_blocks };
            let (k_bytes, v_bytes) = (bytes(config.head_dim, n)?, bytes(config.value_dim, n)?);
            layers.push(LayerStore { at: total, k_bytes, v_bytes, n_blocks: n, sliding });
            total = total.checked_add(k_bytes + v_bytes).ok_or_else(too_big)?;
        }
        let buf = match gpu {
            None => Storage::Host(host_arena(total, &layers).ok_or_else(too_big)?),
            Some(gpu) => {
                if kv_type == KvType::Q8_0 {
                    return Err(ModelError::Unsupported("a q8_0 KV cache on the GPU (use f16 or f32)".into()));
                }
                if n_window_blocks != n_blocks {
                    return Err(ModelError::Unsupported("a split KV pool on the GPU".into()));
                }
                Storage::Device(gpu.zeros::<u8>(total).map_err(|_| too_big())?)
            }
        };
        Ok(KvPool {
            buf,
            layers,
            n_blocks,
            n_window_blocks,
            n_kv_heads: config.n_kv_heads,
            head_dim: config.head_dim,
            value_dim: config.value_dim,
            kv_type,
        })
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Blocks of the sliding-window layers (as many as [`KvPool::n_blocks`] unless split).
    pub fn n_window_blocks(&self) -> usize {
        self.n_window_blocks
    }

    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// Bytes the pool may grow to.
    pub fn capacity_bytes(&self) -> usize {
        self.buf.len()
    }

    /// Whether the pool lives in a GPU's memory.
    pub fn on_device(&self) -> bool {
        matches!(self.buf, Storage::Device(_))
    }

    /// The host bytes: only the CPU forward pass reaches here, and it refuses device pools.
    fn host(&self) -> &Arena {
        match &self.buf {
            Storage::Host(a) => a,
            Storage::Device(_) => panic!("host access to a KV pool on the GPU"),
        }
    }

    /// Device addresses of layer `layer`'s keys and values (device pools only).
    pub(crate) fn device_layer(&self, layer: usize) -> Option<(onebit_cuda::DevPtr, onebit_cuda::DevPtr)> {
        match &self.buf {
            Storage::Device(b) => Some((b.at(self.layer_at(layer, false)), b.at(self.layer_at(layer, true)))),
            Storage::Host(_) => None,
        }
    }

    /// Byte offset of layer `layer`'s keys (or values).
    fn layer_at(&self, layer: usize, values: bool) -> usize {
        let l = &self.layers[layer];
        l.at + if values { l.k_bytes } else { 0 }
    }

    /// Value offset of `slot` of kv head `head` in `block` of layer `layer`, for rows of `width`.
    fn offset(&self, layer: usize, block: usize, head: usize, slot: usize, width: usize) -> usize {
        row_index(self.layers[layer].n_blocks, self.n_kv_heads, block, head, slot) * width
    }

    /// `n` values from value offset `at` of the store starting at byte `base`.
    fn view(&self, base: usize, at: usize, n: usize) -> KvRow<'_> {
        let (start, len) = (base + self.kv_type.bytes(at), self.kv_type.bytes(n));
        let host = self.host();
        assert!(start + len <= host.len(), "a KV row past the end of the pool");
        let bytes = &host.bytes()[start..start + len];
        match self.kv_type {
            KvType::F16 => KvRow::F16(bytemuck::cast_slice(bytes)),
            KvType::F32 => KvRow::F32(bytemuck::cast_slice(bytes)),
            KvType::Q8_0 => KvRow::Q8_0(bytes),
        }
    }

    /// Every layer's key and value bytes at position `pos` of the sequence whose block tables
    /// are `blocks` and (for the sliding-window layers) `window_blocks`, as stored (for comparing
    /// caches bit for bit). Empty for a pool on a GPU.
    pub fn position_bytes(&self, blocks: &[u32], window_blocks: &[u32], pos: usize) -> Vec<u8> {
        if self.on_device() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (layer, store) in self.layers.iter().enumerate() {
            let table = if store.sliding { window_blocks } else { blocks };
            let (block, slot) = (table[pos / BLOCK_TOKENS] as usize, pos % BLOCK_TOKENS);
            for head in 0..self.n_kv_heads {
                for (values, width) in [(false, self.head_dim), (true, self.value_dim)] {
                    let at = self.offset(layer, block, head, slot, width);
                    match self.view(self.layer_at(layer, values), at, width) {
                        KvRow::F16(r) => out.extend_from_slice(bytemuck::cast_slice(r)),
                        KvRow::F32(r) => out.extend_from_slice(bytemuck::cast_slice(r)),
                        KvRow::Q8_0(r) => out.extend_from_slice(r),
                    }
                }
            }
        }
        out
    }

    /// A handle that writes layer `layer`'s keys and values of several positions at once, from
    /// several threads (each position is one (block, slot), written by one thread).
    pub(crate) fn writer(&mut self, layer: usize) -> KvWriter<'_> {
        let LayerStore { at: ko, k_bytes, v_bytes, n_blocks, .. } = self.layers[layer];
        let (n_kv_heads, head_dim, value_dim, kv_type) = (self.n_kv_heads, self.head_dim, self.value_dim, self.kv_type);
        let Storage::Host(host) = &mut self.buf else { panic!("host access to a KV pool on the GPU") };
        let (keys, values) = host.bytes_mut()[ko..ko + k_bytes + v_bytes].split_at_mut(k_bytes);
        // A layer's keys (values) are rows of `head_dim` (`value_dim`) values, one per
        // (block, head, slot): row `offset(block, head, slot, width) / width`.
        KvWriter {
            keys: DisjointRows::new(keys, kv_type.bytes(head_dim)),
            values: DisjointRows::new(values, kv_type.bytes(value_dim)),
            n_blocks,
            n_kv_heads,
            head_dim,
            value_dim,
            kv_type,
        }
    }

    /// The keys of kv head `head` for every position of `block`.
    pub(crate) fn keys(&self, layer: usize, block: usize, head: usize) -> KvRow<'_> {
        let o = self.offset(layer, block, head, 0, self.head_dim);
        self.view(self.layer_at(layer, false), o, BLOCK_TOKENS * self.head_dim)
    }

    pub(crate) fn values(&self, layer: usize, block: usize, head: usize) -> KvRow<'_> {
        let o = self.offset(layer, block, head, 0, self.value_dim);
        self.view(self.layer_at(layer, true), o, BLOCK_TOKENS * self.value_dim)
    }

    /// The keys (or values) of kv head `head` for every position of blocks `block ..
    /// block + n` in one run: they must lie in one superblock.
    pub(crate) fn run(&self, layer: usize, values: bool, block: usize, n: usize, head: usize) -> KvRow<'_> {
        let n_blocks = self.layers[layer].n_blocks;
        assert!(n > 0 && block / SUPER_BLOCKS == (block + n - 1) / SUPER_BLOCKS && block + n <= n_blocks);
        let width = if values { self.value_dim } else { self.head_dim };
        let o = self.offset(layer, block, head, 0, width);
        self.view(self.layer_at(layer, values), o, n * BLOCK_TOKENS * width)
    }
}

/// Writes into one layer of a [`KvPool`] from several threads (see [`KvPool::writer`]).
pub(crate) struct KvWriter<'a> {
    keys: DisjointRows<'a, u8>,
    values: DisjointRows<'a, u8>,
    n_blocks: usize,
    n_kv_heads: usize,
    head_dim: usize,
    value_dim: usize,
    kv_type: KvType,
}

impl KvWriter<'_> {
    /// Store the key and value of every kv head at `slot` of `block`
    /// (k: `n_kv_heads × head_dim` values, v: `n_kv_heads × value_dim`).
    ///
    /// # Safety
    /// No other thread may write the same (block, slot) through this writer at the same time.
    pub unsafe fn write(&self, kernels: Kernels, block: usize, slot: usize, k: &[f32], v: &[f32]) {
        let ty = self.kv_type;
        let (d, dv) = (self.head_dim, self.value_dim);
        let rows = |h: usize| {
            let r = row_index(self.n_blocks, self.n_kv_heads, block, h, slot);
            // SAFETY: (both loops) row `r` of the keys and of the values is position (block,
            // slot) of head `h`, which the caller guarantees nobody else writes meanwhile (and
            // each loop's slices are dropped before the next loop takes them again).
            unsafe { (self.keys.row(r), self.values.row(r)) }
        };
        // The rows are scattered and usually cold: request all their lines first.
        for h in 0..self.n_kv_heads {
            let (k, v) = rows(h);
            onebit_kernels::prefetch(k);
            onebit_kernels::prefetch(v);
        }
        for h in 0..self.n_kv_heads {
            let (k_out, v_out) = rows(h);
            store_raw(kernels, ty, k_out, &k[h * d..(h + 1) * d]);
            store_raw(kernels, ty, v_out, &v[h * dv..(h + 1) * dv]);
        }
    }
}

fn store_raw(kernels: Kernels, ty: KvType, out: &mut [u8], x: &[f32]) {
    match ty {
        KvType::F16 => kernels.f32_to_f16(x, bytemuck::cast_slice_mut(out)),
        KvType::F32 => out.copy_from_slice(bytemuck::cast_slice(x)),
        // The tier's rounding, bit for bit the reference's (`onebit_kernels::act::quantize_q8_0_act`).
        KvType::Q8_0 => kernels.quantize_q8_0(x, out),
    }
}

/// One sequence alone: a private pool with room for `capacity` positions, and how many are
/// filled. For tests, benchmarks and tools that run one sequence; the engine shares one pool
/// among many sequences instead.
pub struct KvCache {
    pub(crate) pool: KvPool,
    pub(crate) blocks: Vec<u32>,
    capacity: usize,
    len: usize,
}

impl std::fmt::Debug for KvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KvCache({} of {} positions)", self.len, self.capacity)
    }
}

impl KvCache {
    /// A cache for `config`'s model holding up to `capacity` positions.
    pub fn new(config: &Config, capacity: usize, kv_type: KvType) -> Result<KvCache, ModelError> {
        let pool = KvPool::new(config, capacity.div_ceil(BLOCK_TOKENS), kv_type)?;
        Ok(KvCache::with_pool(pool, capacity))
    }

    /// A cache over all of `pool` (which must hold `capacity` positions).
    pub(crate) fn with_pool(pool: KvPool, capacity: usize) -> KvCache {
        debug_assert!(pool.n_blocks() * BLOCK_TOKENS >= capacity);
        KvCache { blocks: (0..pool.n_blocks() as u32).collect(), pool, capacity, len: 0 }
    }

    /// Positions filled so far (the next token goes at this position).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Every layer's key and value bytes at position `pos` (< `len()`), as stored.
    pub fn position_bytes(&self, pos: usize) -> Vec<u8> {
        assert!(pos < self.len, "position {pos} is not in the cache ({} positions)", self.len);
        self.pool.position_bytes(&self.blocks, &self.blocks, pos)
    }

    /// Forget positions from `len` on (to reuse a shared prefix, or reject a draft).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Bytes the cache may grow to.
    pub fn capacity_bytes(&self) -> usize {
        self.pool.capacity_bytes()
    }

    pub(crate) fn check_room(&self, n: usize) -> Result<(), ModelError> {
        if self.len + n > self.capacity {
            return Err(ModelError::ContextFull { pos: self.len + n - 1, ctx: self.capacity });
        }
        Ok(())
    }

    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}
