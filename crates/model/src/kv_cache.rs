//! The paged key/value cache.
//!
//! Keys and values live in one [`KvPool`] per model: fixed-size blocks of [`BLOCK_TOKENS`]
//! positions, each holding those positions for every layer and kv head. A sequence owns a block
//! table (block `i` holds its positions `i·BLOCK_TOKENS ..`), so sequences can share blocks of a
//! common prefix, and a sequence's memory grows a block at a time. Attention reads the blocks
//! where they lie, through the table.
//!
//! Storage per layer is `[block][kv head][position in block][dim]`: one head's positions of a
//! block are contiguous, so attention widens them in one run. The pool is allocated zeroed and
//! lazily by the OS: pages of blocks never written are never resident.
//!
//! Rows are kept as IEEE halves (llama.cpp's default), f32, or Q8_0 blocks (34 bytes per 32
//! values, about half the bytes of f16 for attention to read; quantized the way llama.cpp's
//! CPU backend quantizes a Q8_0 cache).
//!
//! [`KvCache`] is the simple form for one sequence alone: a private pool and its table.

use std::str::FromStr;

use onebit_kernels::Kernels;
use onebit_kernels::act::quantize_q8_0_act;
use onebit_kernels::formats::{BlockQ8_0, blocks_mut};

use crate::config::Config;
use crate::error::ModelError;

/// Positions per block.
pub const BLOCK_TOKENS: usize = 16;

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

/// One layer's keys or values for every block.
enum Store {
    F16(Vec<u16>),
    F32(Vec<f32>),
    /// Q8_0 blocks; offsets count values, so a value offset `o` is at byte `o / 32 * 34`.
    Q8_0(Vec<u8>),
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
pub struct KvPool {
    keys: Vec<Store>,
    values: Vec<Store>,
    n_blocks: usize,
    n_kv_heads: usize,
    head_dim: usize,
    value_dim: usize,
    kv_type: KvType,
}

impl std::fmt::Debug for KvPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KvPool({} blocks of {BLOCK_TOKENS}, {})", self.n_blocks, self.kv_type)
    }
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
        kv_type.check(config)?;
        let too_big = || ModelError::OutOfMemory {
            what: format!("a KV cache of {n_blocks} blocks of {BLOCK_TOKENS} positions"),
            bytes: (n_blocks as u128 * KvPool::block_bytes(config, kv_type) as u128).min(u64::MAX as u128) as u64,
        };
        let per_block = |dim: usize| config.n_kv_heads * BLOCK_TOKENS * dim;
        let alloc = |dim: usize| -> Result<Store, ModelError> {
            let n = per_block(dim).checked_mul(n_blocks).ok_or_else(too_big)?;
            Ok(match kv_type {
                KvType::F16 => Store::F16(zeroed(n).ok_or_else(too_big)?),
                KvType::F32 => Store::F32(zeroed(n).ok_or_else(too_big)?),
                KvType::Q8_0 => Store::Q8_0(zeroed(n / 32 * Q8_BLOCK_BYTES).ok_or_else(too_big)?),
            })
        };
        let mut keys = Vec::with_capacity(config.n_layers);
        let mut values = Vec::with_capacity(config.n_layers);
        for _ in 0..config.n_layers {
            keys.push(alloc(config.head_dim)?);
            values.push(alloc(config.value_dim)?);
        }
        Ok(KvPool {
            keys,
            values,
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
        let per = |s: &Store| match s {
            Store::F16(v) => v.len() * 2,
            Store::F32(v) => v.len() * 4,
            Store::Q8_0(v) => v.len(),
        };
        self.keys.iter().chain(&self.values).map(per).sum()
    }

    /// Value offset of `slot` of kv head `head` in `block`, for rows of `width`.
    fn offset(&self, block: usize, head: usize, slot: usize, width: usize) -> usize {
        ((block * self.n_kv_heads + head) * BLOCK_TOKENS + slot) * width
    }

    /// Store the key and value of every kv head at `slot` of `block`
    /// (k: `n_kv_heads × head_dim` values, v: `n_kv_heads × value_dim`).
    pub(crate) fn write(&mut self, kernels: Kernels, layer: usize, block: usize, slot: usize, k: &[f32], v: &[f32]) {
        for h in 0..self.n_kv_heads {
            let ko = self.offset(block, h, slot, self.head_dim);
            store(kernels, &mut self.keys[layer], ko, &k[h * self.head_dim..(h + 1) * self.head_dim]);
            let vo = self.offset(block, h, slot, self.value_dim);
            store(kernels, &mut self.values[layer], vo, &v[h * self.value_dim..(h + 1) * self.value_dim]);
        }
    }

    /// The keys of kv head `head` for every position of `block`.
    pub(crate) fn keys(&self, layer: usize, block: usize, head: usize) -> KvRow<'_> {
        let o = self.offset(block, head, 0, self.head_dim);
        view(&self.keys[layer], o, BLOCK_TOKENS * self.head_dim)
    }

    pub(crate) fn values(&self, layer: usize, block: usize, head: usize) -> KvRow<'_> {
        let o = self.offset(block, head, 0, self.value_dim);
        view(&self.values[layer], o, BLOCK_TOKENS * self.value_dim)
    }
}

/// `n` zeroed values from the allocator's zeroed pages (untouched until written), or `None`
/// when the memory cannot be reserved.
fn zeroed<T: bytemuck::Zeroable>(n: usize) -> Option<Vec<T>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(n).ok()?;
    // SAFETY: the layout has a non-zero size; the allocation is checked for null below.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` holds `n` values of `T` allocated by the global allocator with this layout,
    // all zero, which is a valid `T` (`Zeroable`).
    Some(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

fn store(kernels: Kernels, s: &mut Store, at: usize, x: &[f32]) {
    match s {
        Store::F16(v) => kernels.f32_to_f16(x, &mut v[at..at + x.len()]),
        Store::F32(v) => v[at..at + x.len()].copy_from_slice(x),
        Store::Q8_0(v) => {
            let bytes = &mut v[at / 32 * Q8_BLOCK_BYTES..(at + x.len()) / 32 * Q8_BLOCK_BYTES];
            quantize_q8_0_act(x, blocks_mut(bytes));
        }
    }
}

fn view(s: &Store, at: usize, n: usize) -> KvRow<'_> {
    match s {
        Store::F16(v) => KvRow::F16(&v[at..at + n]),
        Store::F32(v) => KvRow::F32(&v[at..at + n]),
        Store::Q8_0(v) => KvRow::Q8_0(&v[at / 32 * Q8_BLOCK_BYTES..(at + n) / 32 * Q8_BLOCK_BYTES]),
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
        let n_blocks = capacity.div_ceil(BLOCK_TOKENS);
        let pool = KvPool::new(config, n_blocks, kv_type)?;
        Ok(KvCache { pool, blocks: (0..n_blocks as u32).collect(), capacity, len: 0 })
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
