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
//! [`KvCache`] is the simple form for one sequence alone: a private pool and its table.

use std::str::FromStr;

use onebit_kernels::act::quantize_q8_0_act;
use onebit_kernels::arena::Arena;
use onebit_kernels::formats::{BlockQ8_0, blocks_mut};
use onebit_kernels::{DisjointRows, Kernels};

use crate::config::Config;
use crate::error::ModelError;

/// Positions per block.
pub const BLOCK_TOKENS: usize = 16;

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
    /// Bytes of one layer's keys, and of its values.
    k_bytes: usize,
    v_bytes: usize,
    n_blocks: usize,
    n_kv_heads: usize,
    head_dim: usize,
    value_dim: usize,
    kv_type: KvType,
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
        write!(f, "KvPool({} blocks of {BLOCK_TOKENS}, {})", self.n_blocks, self.kv_type)
    }
}

/// A host pool's zeroed bytes: `n_layers` regions of keys then values. Huge pages except for
/// each region's first superblock: a sequence's first token writes one row into it per layer
/// and head, which with huge pages would fault in (and zero) 2 MiB per layer and kind at once,
/// a large part of a first token's time. Attention over long contexts reads the rest in long
/// runs, where huge pages save TLB misses.
fn host_arena(total: usize, n_layers: usize, sizes: [usize; 2], n_blocks: usize) -> Option<Arena> {
    let arena = Arena::try_zeroed_paged(total, false)?;
    let first = SUPER_BLOCKS.min(n_blocks);
    let mut at = 0;
    for _ in 0..n_layers {
        for size in sizes {
            arena.advise_huge(at + size / n_blocks.max(1) * first..at + size);
            at += size;
        }
    }
    Some(arena)
}

impl KvPool {
    /// Bytes one block takes for `config`'s model.
    pub fn block_bytes(config: &Config, kv_type: KvType) -> usize {
        let per_layer = config.n_kv_heads * BLOCK_TOKENS * (config.head_dim + config.value_dim);
        config.n_layers * kv_type.bytes(per_layer)
    }

    /// A pool of `n_blocks` blocks. The memory is reserved, not touched: it becomes resident
    /// as blocks are written. Fails (rather than aborting) when it cannot be reserved.
    pub fn new(config: &Config, n_blocks: usize, kv_type: KvType) -> Result<KvPool, ModelError> {
        KvPool::new_on(config, n_blocks, kv_type, None)
    }

    /// A pool in host memory, or (with `gpu`) in that device's memory.
    pub(crate) fn new_on(
        config: &Config,
        n_blocks: usize,
        kv_type: KvType,
        gpu: Option<&onebit_cuda::Gpu>,
    ) -> Result<KvPool, ModelError> {
        kv_type.check(config)?;
        let too_big = || ModelError::OutOfMemory {
            what: format!("a KV cache of {n_blocks} blocks of {BLOCK_TOKENS} positions"),
            bytes: (n_blocks as u128 * KvPool::block_bytes(config, kv_type) as u128).min(u64::MAX as u128) as u64,
        };
        let layer = |dim: usize| {
            (config.n_kv_heads * BLOCK_TOKENS * dim).checked_mul(n_blocks).map(|n| kv_type.bytes(n)).ok_or_else(too_big)
        };
        let (k_bytes, v_bytes) = (layer(config.head_dim)?, layer(config.value_dim)?);
        let total = (k_bytes + v_bytes).checked_mul(config.n_layers).ok_or_else(too_big)?;
        let buf = match gpu {
            None => {
                Storage::Host(host_arena(total, config.n_layers, [k_bytes, v_bytes], n_blocks).ok_or_else(too_big)?)
            }
            Some(gpu) => {
                if kv_type == KvType::Q8_0 {
                    return Err(ModelError::Unsupported("a q8_0 KV cache on the GPU (use f16 or f32)".into()));
                }
                Storage::Device(gpu.zeros::<u8>(total).map_err(|_| too_big())?)
            }
        };
        Ok(KvPool {
            buf,
            k_bytes,
            v_bytes,
            n_blocks,
            n_kv_heads: config.n_kv_heads,
            head_dim: config.head_dim,
            value_dim: config.value_dim,
            kv_type,
        })
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
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
        layer * (self.k_bytes + self.v_bytes) + if values { self.k_bytes } else { 0 }
    }

    /// Value offset of `slot` of kv head `head` in `block`, for rows of `width`.
    fn offset(&self, block: usize, head: usize, slot: usize, width: usize) -> usize {
        row_index(self.n_blocks, self.n_kv_heads, block, head, slot) * width
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

    /// Every layer's key and value bytes at position `pos` of the sequence whose block table is
    /// `blocks`, as stored (for comparing caches bit for bit). Empty for a pool on a GPU.
    pub fn position_bytes(&self, blocks: &[u32], pos: usize) -> Vec<u8> {
        if self.on_device() {
            return Vec::new();
        }
        let (block, slot) = (blocks[pos / BLOCK_TOKENS] as usize, pos % BLOCK_TOKENS);
        let n_layers = self.buf.len().checked_div(self.k_bytes + self.v_bytes).unwrap_or(0);
        let mut out = Vec::new();
        for layer in 0..n_layers {
            for head in 0..self.n_kv_heads {
                for (values, width) in [(false, self.head_dim), (true, self.value_dim)] {
                    let at = self.offset(block, head, slot, width);
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
        let (ko, k_bytes, v_bytes) = (self.layer_at(layer, false), self.k_bytes, self.v_bytes);
        let (n_kv_heads, head_dim, value_dim, kv_type) = (self.n_kv_heads, self.head_dim, self.value_dim, self.kv_type);
        let Storage::Host(host) = &mut self.buf else { panic!("host access to a KV pool on the GPU") };
        let (keys, values) = host.bytes_mut()[ko..ko + k_bytes + v_bytes].split_at_mut(k_bytes);
        // A layer's keys (values) are rows of `head_dim` (`value_dim`) values, one per
        // (block, head, slot): row `offset(block, head, slot, width) / width`.
        KvWriter {
            keys: DisjointRows::new(keys, kv_type.bytes(head_dim)),
            values: DisjointRows::new(values, kv_type.bytes(value_dim)),
            n_blocks: self.n_blocks,
            n_kv_heads,
            head_dim,
            value_dim,
            kv_type,
        }
    }

    /// The keys of kv head `head` for every position of `block`.
    pub(crate) fn keys(&self, layer: usize, block: usize, head: usize) -> KvRow<'_> {
        let o = self.offset(block, head, 0, self.head_dim);
        self.view(self.layer_at(layer, false), o, BLOCK_TOKENS * self.head_dim)
    }

    pub(crate) fn values(&self, layer: usize, block: usize, head: usize) -> KvRow<'_> {
        let o = self.offset(block, head, 0, self.value_dim);
        self.view(self.layer_at(layer, true), o, BLOCK_TOKENS * self.value_dim)
    }

    /// The keys (or values) of kv head `head` for every position of blocks `block ..
    /// block + n` in one run: they must lie in one superblock.
    pub(crate) fn run(&self, layer: usize, values: bool, block: usize, n: usize, head: usize) -> KvRow<'_> {
        assert!(n > 0 && block / SUPER_BLOCKS == (block + n - 1) / SUPER_BLOCKS && block + n <= self.n_blocks);
        let width = if values { self.value_dim } else { self.head_dim };
        let o = self.offset(block, head, 0, width);
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
        KvType::Q8_0 => quantize_q8_0_act(x, blocks_mut(out)),
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
        self.pool.position_bytes(&self.blocks, pos)
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
