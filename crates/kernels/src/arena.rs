//! Large zeroed buffers that are written long after they are made: the repacked weights (one
//! mapping per model, or per matrix packed alone) and the KV pool. 2 MiB aligned and backed by
//! transparent huge pages where the system allows, so that writing a model's packed copy or a
//! pool's blocks takes a few hundred page faults instead of hundreds of thousands (expensive in
//! a VM), and reserved without being touched, so that a pool costs memory only as it fills.

/// Huge page size (x86-64 and aarch64 with 4 KiB pages).
#[cfg(target_os = "linux")]
const HUGE: usize = 2 << 20;

/// A zeroed byte buffer of fixed length, aligned to at least 64 bytes (to 2 MiB when large).
pub struct Arena {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    /// What to give back on drop: the mapping's length (unix), or the allocation's layout.
    #[cfg(unix)]
    map_len: usize,
    #[cfg(not(unix))]
    layout: Option<std::alloc::Layout>,
}

// SAFETY: an `Arena` owns plain bytes; shared references only read them, and writes need
// `&mut self`, so it is as thread-safe as a `Box<[u8]>`.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Arena({} bytes)", self.len)
    }
}

impl Arena {
    /// `len` zero bytes; aborts as an allocation failure would when they cannot be had.
    pub fn zeroed(len: usize) -> Arena {
        Arena::try_zeroed(len).unwrap_or_else(|| {
            std::alloc::handle_alloc_error(std::alloc::Layout::from_size_align(len, 64).expect("arena size overflows"))
        })
    }

    /// `len` zero bytes, or `None` when the system will not reserve them. On unix a fresh
    /// anonymous mapping (zero pages, faulted in by whichever thread first writes them, no swap
    /// reserved); from 2 MiB up it starts on a 2 MiB boundary and is advised for huge pages.
    pub fn try_zeroed(len: usize) -> Option<Arena> {
        Arena::try_zeroed_paged(len, true)
    }

    /// [`Arena::try_zeroed`], advised for huge pages only when `huge` (see
    /// [`Arena::advise_huge`] for advising parts later).
    #[cfg(unix)]
    pub fn try_zeroed_paged(len: usize, huge: bool) -> Option<Arena> {
        if len == 0 {
            return Some(Arena { ptr: std::ptr::NonNull::dangling(), len: 0, map_len: 0 });
        }
        #[cfg(target_os = "linux")]
        let align = if len >= HUGE { HUGE } else { 1 };
        #[cfg(not(target_os = "linux"))]
        let align = 1;
        let page = page_size();
        let map_len = len.checked_next_multiple_of(page)?;
        let over = map_len.checked_add(if align > page { align } else { 0 })?;
        // SAFETY: a new private anonymous mapping; it aliases nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                over,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let base = p as usize;
        let start = base.next_multiple_of(align.max(page));
        // Give back the parts before and after the aligned range.
        let (head, tail) = (start - base, over - (start - base) - map_len);
        // SAFETY: both ranges are page-aligned parts of the mapping just made, outside the
        // range kept.
        unsafe {
            if head > 0 {
                libc::munmap(base as *mut libc::c_void, head);
            }
            if tail > 0 {
                libc::munmap((start + map_len) as *mut libc::c_void, tail);
            }
        }
        #[cfg(target_os = "linux")]
        if huge && len >= HUGE {
            // SAFETY: the range is our own mapping; MADV_HUGEPAGE changes how its pages are
            // backed, never their contents. Advice only: failure changes nothing.
            unsafe { libc::madvise(start as *mut libc::c_void, map_len, libc::MADV_HUGEPAGE) };
        }
        let ptr = std::ptr::NonNull::new(start as *mut u8)?;
        Some(Arena { ptr, len, map_len })
    }

    /// `len` zero bytes, 64-byte aligned, or `None` when they cannot be allocated.
    #[cfg(not(unix))]
    pub fn try_zeroed_paged(len: usize, _huge: bool) -> Option<Arena> {
        if len == 0 {
            return Some(Arena { ptr: std::ptr::NonNull::dangling(), len: 0, layout: None });
        }
        let layout = std::alloc::Layout::from_size_align(len, 64).ok()?;
        // SAFETY: the layout is non-zero in size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(p)?;
        Some(Arena { ptr, len, layout: Some(layout) })
    }

    /// Advise the whole huge pages inside `range` for huge pages (where the system has them):
    /// for a buffer whose first pages are touched sparsely (one small write each, where a huge
    /// page would make 2 MiB resident) and whose later parts are read in long runs.
    pub fn advise_huge(&self, range: std::ops::Range<usize>) {
        #[cfg(target_os = "linux")]
        {
            let base = self.ptr.as_ptr() as usize;
            let start = (base + range.start).next_multiple_of(HUGE);
            let end = (base + range.end.min(self.len)) / HUGE * HUGE;
            if end > start {
                // SAFETY: the range lies inside our own mapping; MADV_HUGEPAGE changes how its
                // pages are backed, never their contents. Advice only: failure changes nothing.
                unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = range;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points at `len` bytes we own (zeroed at creation, so initialised), or is
        // dangling with `len == 0`; only `&mut self` writes them.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes the view unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        #[cfg(unix)]
        if self.map_len > 0 {
            // SAFETY: the mapping was made in `zeroed` with this address and length, and no
            // borrow of it outlives `self`.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.map_len) };
        }
        #[cfg(not(unix))]
        if let Some(layout) = self.layout {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

#[cfg(unix)]
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_and_aligned() {
        for len in [0, 1, 100, 4096, 5000, 3 << 20] {
            let mut a = Arena::zeroed(len);
            assert_eq!(a.len(), len);
            assert!(a.bytes().iter().all(|&b| b == 0));
            if len > 0 {
                assert_eq!(a.bytes().as_ptr() as usize % 64, 0);
            }
            a.bytes_mut().iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
            assert!(a.bytes().iter().enumerate().all(|(i, &b)| b == i as u8));
        }
        #[cfg(target_os = "linux")]
        assert_eq!(Arena::zeroed(3 << 20).bytes().as_ptr() as usize % HUGE, 0);
    }
}
