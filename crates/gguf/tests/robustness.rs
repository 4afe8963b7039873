//! Damaged variants of every model in ../shared: each must open as an error or as a model
//! whose every tensor and value can be read, never panic, and stay within time and memory.
//!
//! The variants are seeded, so a failure names a reproducible case. The structure of each file
//! (where its counts, lengths, types and offsets are) is found by a small independent walker
//! here, not by the reader under test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use onebit_gguf::{GgufFile, INDEX_SLACK, Value, ValueType};

// ---- a counting allocator: peak bytes allocated by this thread while a variant is opened ----

struct Counting;

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every allocation and deallocation is the system allocator's, with the caller's
// layout; the counting beside it never allocates (thread-local `Cell`s, `try_with`).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = CURRENT.try_with(|c| {
            c.set(c.get() + layout.size());
            let _ = PEAK.try_with(|p| p.set(p.get().max(c.get())));
        });
        // SAFETY: `GlobalAlloc::alloc`'s contract, passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = CURRENT.try_with(|c| c.set(c.get().saturating_sub(layout.size())));
        // SAFETY: `ptr` came from `System.alloc` with this layout (every allocation goes there).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn reset_peak() -> usize {
    let now = CURRENT.with(|c| c.get());
    PEAK.with(|p| p.set(now));
    now
}

fn peak() -> usize {
    PEAK.with(|p| p.get())
}

// ---- a seeded generator (splitmix64) ----

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

// ---- where the fields of a well-formed file are ----

#[derive(Default)]
struct Fields {
    /// Offsets of u64 counts and lengths (tensor/kv counts, string lengths, array counts).
    lengths: Vec<usize>,
    /// Offsets of u32 type ids (value types, array element types).
    value_types: Vec<usize>,
    /// Per tensor info: offsets of n_dims, of the first dim, of the type and of the data offset.
    tensors: Vec<(usize, usize, usize, usize)>,
    /// Where the metadata and tensor infos end.
    header_end: usize,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn walk_value(b: &[u8], pos: &mut usize, ty: u32, f: &mut Fields) {
    match ty {
        0 | 1 | 7 => *pos += 1,
        2 | 3 => *pos += 2,
        4..=6 => *pos += 4,
        10..=12 => *pos += 8,
        8 => {
            f.lengths.push(*pos);
            *pos += 8 + u64_at(b, *pos) as usize;
        }
        9 => {
            f.value_types.push(*pos);
            let elem = u32_at(b, *pos);
            f.lengths.push(*pos + 4);
            let n = u64_at(b, *pos + 4);
            *pos += 12;
            // Long arrays: note only the first few element fields, skip the rest quickly.
            for i in 0..n {
                if i < 4 {
                    walk_value(b, pos, elem, f);
                } else {
                    let mut scratch = Fields::default();
                    walk_value(b, pos, elem, &mut scratch);
                }
            }
        }
        _ => panic!("well-formed input has value type {ty}"),
    }
}

fn walk(b: &[u8]) -> Fields {
    let mut f = Fields { lengths: vec![8, 16], ..Default::default() };
    let n_tensors = u64_at(b, 8);
    let n_kv = u64_at(b, 16);
    let mut pos = 24;
    for _ in 0..n_kv {
        f.lengths.push(pos);
        pos += 8 + u64_at(b, pos) as usize;
        f.value_types.push(pos);
        let ty = u32_at(b, pos);
        pos += 4;
        walk_value(b, &mut pos, ty, &mut f);
    }
    for _ in 0..n_tensors {
        f.lengths.push(pos);
        pos += 8 + u64_at(b, pos) as usize;
        let n_dims = u32_at(b, pos) as usize;
        let dims = pos + 4;
        pos = dims + 8 * n_dims;
        f.tensors.push((dims - 4, dims, pos, pos + 4));
        pos += 12;
    }
    f.header_end = pos;
    f
}

// ---- the damage ----

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// One damaged copy of `orig`, of kind `kind`, and a label for failure messages.
fn damage(orig: &[u8], f: &Fields, kind: usize, rng: &mut Rng) -> (Vec<u8>, String) {
    let mut b = orig.to_vec();
    let label = match kind {
        0 => {
            // Truncation, mostly within the header, sometimes in the data.
            let len = if rng.below(4) == 0 { rng.below(orig.len()) } else { rng.below(f.header_end + 64) };
            b.truncate(len.min(orig.len()));
            format!("truncated to {len}")
        }
        1 => {
            let n = 1 + rng.below(4);
            for _ in 0..n {
                let at = rng.below(f.header_end);
                b[at] ^= 1 << rng.below(8);
            }
            format!("{n} bit flips in the header")
        }
        2 => {
            let at = rng.below(f.header_end);
            b[at] = rng.next() as u8;
            format!("random byte at {at}")
        }
        3 => {
            let at = f.lengths[rng.below(f.lengths.len())];
            let old = u64_at(&b, at);
            let v = [u64::MAX, 1 << 63, orig.len() as u64, orig.len() as u64 + 1, old * 2 + 1, old + 1, 0x7fff_ffff]
                [rng.below(7)];
            put_u64(&mut b, at, v);
            format!("length/count at {at}: {old} -> {v}")
        }
        4 => {
            let at = f.value_types[rng.below(f.value_types.len())];
            let v = [13, 99, u32::MAX, rng.below(13) as u32][rng.below(4)];
            put_u32(&mut b, at, v);
            format!("value type at {at} -> {v}")
        }
        _ if f.tensors.is_empty() => damage(orig, f, kind % 5, rng).1,
        5 => {
            let (_, _, _, off) = f.tensors[rng.below(f.tensors.len())];
            let old = u64_at(&b, off);
            let v = old + 1 + rng.below(31) as u64;
            put_u64(&mut b, off, v);
            format!("misaligned data offset at {off}: {old} -> {v}")
        }
        6 => {
            let (_, _, _, a) = f.tensors[rng.below(f.tensors.len())];
            let (_, _, _, c) = f.tensors[rng.below(f.tensors.len())];
            let v = u64_at(&b, c) + 32 * rng.below(3) as u64;
            put_u64(&mut b, a, v);
            format!("overlapping data offset at {a} -> {v}")
        }
        7 => {
            let (_, _, ty, _) = f.tensors[rng.below(f.tensors.len())];
            let v = [4, 5, 31, 36, 43, 255, u32::MAX, rng.below(43) as u32][rng.below(8)];
            put_u32(&mut b, ty, v);
            format!("tensor type at {ty} -> {v}")
        }
        _ => {
            let (nd, d0, _, _) = f.tensors[rng.below(f.tensors.len())];
            match rng.below(3) {
                0 => put_u32(&mut b, nd, [0, 5, 64, u32::MAX][rng.below(4)]),
                1 => put_u64(&mut b, d0, [0, 1, 1 << 40, 1 << 62, u64::MAX][rng.below(5)]),
                _ => put_u64(&mut b, d0, u64_at(orig, d0) * 2),
            }
            format!("tensor shape at {nd}")
        }
    };
    (b, label)
}

/// Read everything a user of the file could read; none of it may panic.
fn read_all(f: &GgufFile) -> u64 {
    let mut n = 0u64;
    let md = f.metadata();
    for (k, v) in md.iter() {
        n += k.len() as u64;
        match v {
            Value::Array(a) => {
                n += match a.elem_type() {
                    ValueType::String => md.get_str_array(k).map(|v| v.len()).unwrap_or(0),
                    ValueType::F32 | ValueType::F64 => md.get_f32_array(k).map(|v| v.len()).unwrap_or(0),
                    ValueType::Array | ValueType::Bool => a.iter().count(),
                    _ => md.get_i32_array(k).map(|v| v.len()).unwrap_or(0),
                } as u64;
            }
            Value::String(_) => n += md.get_str(k).map(|s| s.len() as u64).unwrap_or(0),
            _ => n += md.get_u64(k).unwrap_or(0) % 7,
        }
    }
    for t in f.tensors() {
        n += t.data().iter().step_by(4096).map(|&x| x as u64).sum::<u64>() + t.n_elements() % 3;
        assert!(f.tensor(t.name()).is_some());
    }
    n
}

#[test]
fn damaged_models_never_panic_hang_or_overallocate() {
    let models = onebit_testkit::shared_models(true);
    if models.is_empty() {
        return;
    }
    const PER_MODEL: usize = 160;
    const KINDS: usize = 9;
    let started = Instant::now();
    let (mut total, mut rejected) = (0usize, 0usize);
    let mut rng = Rng(0x0b1_b17);
    for path in &models {
        let orig = std::fs::read(path).unwrap();
        let fields = walk(&orig);
        for i in 0..PER_MODEL {
            let (bytes, label) = damage(&orig, &fields, i % KINDS, &mut rng);
            let case = format!("{} variant {i} ({label})", path.file_name().unwrap().to_string_lossy());
            let len = bytes.len();
            let t0 = Instant::now();
            let before = reset_peak();
            let opened = std::panic::catch_unwind(|| GgufFile::from_bytes(bytes));
            let grew = peak().saturating_sub(before);
            let opened = opened.unwrap_or_else(|_| panic!("{case}: panicked"));
            assert!(
                grew as u64 <= len as u64 + INDEX_SLACK,
                "{case}: opening allocated {grew} bytes for a {len}-byte file"
            );
            match opened {
                Ok(f) => {
                    std::panic::catch_unwind(|| read_all(&f)).unwrap_or_else(|_| panic!("{case}: reading panicked"));
                }
                Err(e) => {
                    assert!(!e.to_string().is_empty());
                    rejected += 1;
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(2), "{case}: took {:?}", t0.elapsed());
            total += 1;
        }
    }
    eprintln!(
        "{total} damaged variants of {} models: {rejected} rejected, {} opened, in {:.1?}",
        models.len(),
        total - rejected,
        started.elapsed()
    );
    assert!(total >= 2000);
}
