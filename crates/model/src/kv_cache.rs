//! The key/value cache of one sequence.
//!
//! Each sequence owns its cache, sized to its context when created. Storage is
//! `[layer][kv head][position][dim]`, so one head's keys are contiguous across positions
//! (attention streams them), and memory is allocated zeroed: pages past the filled positions
//! are never touched, so resident memory grows with the sequence, not with the context size.
//!
//! Rows are kept as IEEE halves (llama.cpp's default), f32, or Q8_0 blocks (34 bytes per 32
//! values, about half the bytes of f16 for attention to read; quantized the way llama.cpp's
//! CPU backend quantizes a Q8_0 cache).

use std::str::FromStr;

use onebit_kernels::Kernels;
use onebit_kernels::act::quantize_q8_0_act;
use onebit_kernels::formats::{BlockQ8_0, blocks_mut};

use crate::config::Config;
use crate::error::ModelError;

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

enum Store {
    F16(Vec<u16>),
    F32(Vec<f32>),
    /// Q8_0 blocks; offsets count values, so a value offset `o` is at byte `o / 32 * 34`.
    Q8_0(Vec<u8>),
}

/// Borrowed cached rows of keys or values (consecutive positions of one head).
#[derive(Clone, Copy)]
pub enum KvRow<'a> {
    F16(&'a [u16]),
    F32(&'a [f32]),
    Q8_0(&'a [u8]),
}

const Q8_BLOCK_BYTES: usize = std::mem::size_of::<BlockQ8_0>();

pub struct KvCache {
    keys: Vec<Store>,
    values: Vec<Store>,
    n_kv_heads: usize,
    head_dim: usize,
    value_dim: usize,
    capacity: usize,
    len: usize,
}

impl KvCache {
    /// A cache for `config`'s model holding up to `capacity` positions.
    ///
    /// A Q8_0 cache needs head sizes that are multiples of 32.
    pub fn new(config: &Config, capacity: usize, kv_type: KvType) -> Result<KvCache, ModelError> {
        kv_type.check(config)?;
        Ok(KvCache::new_checked(config, capacity, kv_type))
    }

    /// As [`KvCache::new`], for a type already checked against the config.
    pub(crate) fn new_checked(config: &Config, capacity: usize, kv_type: KvType) -> KvCache {
        let alloc = |n: usize| match kv_type {
            KvType::F16 => Store::F16(vec![0u16; n]),
            KvType::F32 => Store::F32(vec![0f32; n]),
            KvType::Q8_0 => Store::Q8_0(vec![0u8; n / 32 * Q8_BLOCK_BYTES]),
        };
        let k_len = config.n_kv_heads * capacity * config.head_dim;
        let v_len = config.n_kv_heads * capacity * config.value_dim;
        KvCache {
            keys: (0..config.n_layers).map(|_| alloc(k_len)).collect(),
            values: (0..config.n_layers).map(|_| alloc(v_len)).collect(),
            n_kv_heads: config.n_kv_heads,
            head_dim: config.head_dim,
            value_dim: config.value_dim,
            capacity,
            len: 0,
        }
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

    pub(crate) fn check_room(&self, n: usize) -> Result<(), ModelError> {
        if self.len + n > self.capacity {
            return Err(ModelError::ContextFull { pos: self.len + n - 1, ctx: self.capacity });
        }
        Ok(())
    }

    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    fn offset(&self, head: usize, pos: usize, width: usize) -> usize {
        (head * self.capacity + pos) * width
    }

    /// Store the key and value of every kv head for `pos` (k: `n_kv_heads * head_dim` values).
    pub(crate) fn write(&mut self, kernels: Kernels, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        for h in 0..self.n_kv_heads {
            let ko = self.offset(h, pos, self.head_dim);
            store(kernels, &mut self.keys[layer], ko, &k[h * self.head_dim..(h + 1) * self.head_dim]);
            let vo = self.offset(h, pos, self.value_dim);
            store(kernels, &mut self.values[layer], vo, &v[h * self.value_dim..(h + 1) * self.value_dim]);
        }
    }

    /// Keys of kv head `head` for positions `0..n`, contiguous.
    pub(crate) fn keys(&self, layer: usize, head: usize, n: usize) -> KvRow<'_> {
        let o = self.offset(head, 0, self.head_dim);
        view(&self.keys[layer], o, n * self.head_dim)
    }

    pub(crate) fn values(&self, layer: usize, head: usize, n: usize) -> KvRow<'_> {
        let o = self.offset(head, 0, self.value_dim);
        view(&self.values[layer], o, n * self.value_dim)
    }

    /// Bytes the cache may grow to.
    pub fn capacity_bytes(&self) -> usize {
        let per = |s: &Store| match s {
            Store::F16(v) => v.len() * 2,
            Store::F32(v) => v.len() * 4,
            Store::Q8_0(v) => v.len(),
        };
        self.keys.iter().chain(&self.values).map(per).sum()
    }
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
