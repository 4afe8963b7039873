//! [`DisjointRows`]: one output buffer written by several threads, each row by one of them.

use std::marker::PhantomData;
use std::ops::Range;

/// A mutable buffer of rows (`row_len` values each) that threads of a parallel region write
/// together, each row (or each part of a row, see [`DisjointRows::row_part`]) handed to one
/// thread at a time. It borrows the buffer mutably for `'a`, so nothing else reads or writes it
/// meanwhile; the accessors are `unsafe` because only the caller knows which thread owns which
/// rows (the pool hands every index of a range to exactly one thread).
///
/// Row indices are checked (once per row, never inside a kernel's loop); what the accessors
/// cannot check is that no two threads hold the same values at once.
pub struct DisjointRows<'a, T> {
    ptr: *mut T,
    len: usize,
    row_len: usize,
    /// `len / row_len`, or 0 for rows of nothing (kept: checking a row index is a compare).
    rows: usize,
    _buf: PhantomData<&'a mut [T]>,
}

impl<T> Clone for DisjointRows<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for DisjointRows<'_, T> {}

// SAFETY: a `DisjointRows` is a `&mut [T]` shared by threads; every access goes through the
// unsafe accessors, whose contract is that no two threads touch the same values at once, so
// values of `T` are only ever moved between threads (`T: Send`), never shared.
unsafe impl<T: Send> Send for DisjointRows<'_, T> {}
// SAFETY: as for `Send`: sharing the handle hands out disjoint parts only.
unsafe impl<T: Send> Sync for DisjointRows<'_, T> {}

impl<'a, T> DisjointRows<'a, T> {
    /// The rows of `buf`, `row_len` values each (a tail shorter than a row is not reachable).
    #[inline]
    pub fn new(buf: &'a mut [T], row_len: usize) -> DisjointRows<'a, T> {
        let rows = buf.len().checked_div(row_len).unwrap_or(0);
        DisjointRows { ptr: buf.as_mut_ptr(), len: buf.len(), row_len, rows, _buf: PhantomData }
    }

    /// Values per row.
    #[inline]
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// Whole rows in the buffer.
    #[inline]
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values in the buffer.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Row `r`. Panics if there is no such row.
    ///
    /// # Safety
    /// No other thread may read or write row `r` while the returned slice lives.
    #[inline(always)]
    pub unsafe fn row(&self, r: usize) -> &'a mut [T] {
        assert!(r < self.rows || self.row_len == 0, "row {r} of {} rows", self.rows);
        // SAFETY: the row lies inside the borrowed buffer (just checked); exclusive by the
        // caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r * self.row_len), self.row_len) }
    }

    /// Values `cols` of row `r`, for threads that share a row by parts. Panics if they are not
    /// inside the row.
    ///
    /// # Safety
    /// No other thread may read or write these values while the returned slice lives.
    #[inline(always)]
    pub unsafe fn row_part(&self, r: usize, cols: Range<usize>) -> &'a mut [T] {
        let row_ok = r < self.rows || self.row_len == 0;
        assert!(row_ok && cols.start <= cols.end && cols.end <= self.row_len, "part of a row out of bounds");
        // SAFETY: inside row `r` of the borrowed buffer (just checked); exclusive by the
        // caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r * self.row_len + cols.start), cols.len()) }
    }

    /// Where value `i` of the buffer (counted from its start, across rows) lies, for kernels
    /// that store vectors or single values into a layout the rows do not describe (e.g. a
    /// product's output, shared by column ranges). Checked in debug builds only: this is
    /// called inside kernels' loops.
    ///
    /// # Safety
    /// `i` must be inside the buffer (`i < self.len()`, or `i == self.len()` for a pointer
    /// that is not written), and the caller may write only values no other thread touches.
    #[inline(always)]
    pub unsafe fn ptr_at(&self, i: usize) -> *mut T {
        debug_assert!(i <= self.len);
        // SAFETY: in bounds by the caller's contract.
        unsafe { self.ptr.add(i) }
    }
}

#[cfg(test)]
mod tests {
    use super::DisjointRows;
    use crate::Pool;

    #[test]
    fn rows_from_threads() {
        let pool = Pool::new(3);
        let mut buf = vec![0u32; 7 * 5 + 2];
        let rows = DisjointRows::new(&mut buf, 5);
        assert_eq!((rows.rows(), rows.len()), (7, 37));
        pool.for_chunks(7, 1, &|_, range| {
            for r in range {
                // SAFETY: the pool hands each row index to one thread.
                let row = unsafe { rows.row(r) };
                row.iter_mut().enumerate().for_each(|(i, v)| *v = (10 * r + i) as u32);
            }
        });
        assert_eq!(&buf[5..10], &[10, 11, 12, 13, 14]);
        assert_eq!(&buf[35..], &[0, 0]);
    }

    #[test]
    fn parts_of_rows() {
        let mut buf = vec![0u8; 8];
        let rows = DisjointRows::new(&mut buf, 4);
        // SAFETY: one thread, and the two parts do not overlap.
        let (a, b) = unsafe { (rows.row_part(1, 0..2), rows.row_part(1, 2..4)) };
        a.fill(1);
        b.fill(2);
        assert_eq!(buf, [0, 0, 0, 0, 1, 1, 2, 2]);
    }

    #[test]
    #[should_panic]
    fn row_past_the_end() {
        let mut buf = vec![0u8; 9];
        let rows = DisjointRows::new(&mut buf, 4);
        // SAFETY: one thread; the index is out of bounds, which must panic.
        let _ = unsafe { rows.row(2) };
    }

    #[test]
    #[should_panic]
    fn part_past_the_row() {
        let mut buf = vec![0u8; 8];
        let rows = DisjointRows::new(&mut buf, 4);
        // SAFETY: one thread; the part runs past the row, which must panic.
        let _ = unsafe { rows.row_part(0, 2..5) };
    }
}
