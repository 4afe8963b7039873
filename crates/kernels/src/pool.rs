//! A lean thread pool for the forward pass: one job at a time, shared by whichever threads are
//! free, and one side task that a worker runs beside the jobs.
//!
//! A token of an 8B model is ~250 matrix products, so the handoff between them must cost
//! microseconds, not the tens of microseconds a general task scheduler spends. Here the caller
//! publishes a job (a borrowed closure) by bumping a generation counter; workers that are
//! spinning see it at once, workers that were parked are woken; the caller runs its own share
//! and then closes the job and waits for the workers that joined it. Every job hands out its
//! work dynamically (`for_chunks`), so a worker that is late, parked or busy with the side task
//! costs nothing: the threads present do its share. `run` allocates nothing per job
//! (`for_shrinking` one word per thread). Workers spin only briefly after a job and then sleep
//! on a condition variable, so an idle pool costs nothing.
//!
//! The side task ([`Pool::beside`]) exists for work that must overlap the forward pass without
//! a thread of its own: a grammar mask on a two-core machine. A third thread would take a core
//! from a pool thread in the middle of a job, and every job would wait for it; a pool worker
//! that leaves the jobs to the others for a while costs only its share.

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker keeps spinning before it parks.
const SPIN: Duration = Duration::from_micros(300);

type Job = dyn Fn(usize) + Sync;
type Side = dyn FnMut() + Send;
type Panic = Box<dyn std::any::Any + Send>;

/// The job state word: the job's generation, whether it is closed to newcomers, and how many
/// workers are inside it. One word, so that joining checks all three at once.
const COUNT_MASK: u64 = 0xffff;
const CLOSED: u64 = 1 << 16;
const GEN_SHIFT: u32 = 17;

fn generation(state: u64) -> u64 {
    state >> GEN_SHIFT
}

/// The side task's pointer, erased to `'static` while [`Pool::beside`] keeps it alive.
struct SidePtr(*mut Side);
// SAFETY: the pointee is `Send` (the `Side` bound), and the pointer moves to one thread only.
unsafe impl Send for SidePtr {}

struct Shared {
    /// The current job, valid while some worker counted in `state` runs it.
    job: UnsafeCell<Option<*const Job>>,
    state: AtomicU64,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    panic: Mutex<Option<Panic>>,
    busy: AtomicBool,
    /// The side task on offer (taken by the first free worker, or by the caller at the end).
    side: Mutex<Option<SidePtr>>,
    side_offered: AtomicBool,
    side_done: AtomicBool,
    side_panic: Mutex<Option<Panic>>,
}

// SAFETY: `job` is written only by the publishing thread while no worker is inside a job (the
// previous one is closed and its count is zero), and read by a worker only after it joined the
// open job of the current generation (a successful compare-exchange on `state`, Acquire) and
// before it leaves (Release decrement), while the publisher waits.
unsafe impl Sync for Shared {}
// SAFETY: the raw pointers (`job`, `side`) are only dereferenced under the protocol above, and
// every other field is `Send`; the pool's threads hold `Shared` through an `Arc`.
unsafe impl Send for Shared {}

/// A fixed set of threads that run one job at a time. Thread 0 is the caller.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
}

impl Pool {
    /// A pool of `n_threads` threads in all (the caller plus `n_threads - 1` workers).
    pub fn new(n_threads: usize) -> Pool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(None),
            state: AtomicU64::new(CLOSED),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            panic: Mutex::new(None),
            busy: AtomicBool::new(false),
            side: Mutex::new(None),
            side_offered: AtomicBool::new(false),
            side_done: AtomicBool::new(false),
            side_panic: Mutex::new(None),
        });
        let workers = (1..n_threads)
            .map(|tid| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("onebit-{tid}"))
                    .spawn(move || worker(&shared, tid))
                    .expect("spawning a pool thread")
            })
            .collect();
        Pool { shared, workers, n_threads }
    }

    /// The number of cores this process may use.
    pub fn default_threads() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Run `f(thread_index)` on the caller and on every worker that is free to join before the
    /// caller's own call returns; return when all of them have finished. Each thread index runs
    /// at most once, the caller's (0) always; a job must not count on the others (hand out work
    /// dynamically, as [`Pool::for_chunks`] does). A panic in any thread is re-raised here.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.n_threads == 1 {
            f(0);
            return;
        }
        let s = &*self.shared;
        assert!(!s.busy.swap(true, Ordering::Acquire), "Pool::run is not reentrant");
        // SAFETY: no worker is inside a job (the previous `run` closed its job and waited for
        // its count to reach zero), so nobody reads `job` now. The lifetime is erased only until
        // this call returns, and this call does not return before every worker that joined has
        // left.
        unsafe {
            let erased: *const Job = std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Job>(f);
            *s.job.get() = Some(erased);
        }
        let next = generation(s.state.load(Ordering::Relaxed)) + 1;
        s.state.store(next << GEN_SHIFT, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        s.state.fetch_or(CLOSED, Ordering::AcqRel);
        while s.state.load(Ordering::Acquire) & COUNT_MASK != 0 {
            std::hint::spin_loop();
        }
        s.busy.store(false, Ordering::Release);
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if let Some(p) = s.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
            resume_unwind(p);
        }
    }

    /// Run `main` on the caller (its jobs shared by the pool as usual) and `side` on a worker
    /// beside it, which leaves the jobs to the other threads until `side` is done; returns
    /// both results. With one thread, or when no worker picked `side` up by the time `main`
    /// returned, the caller runs `side` itself afterwards. `side` must not use the pool.
    pub fn beside<A: Send, R>(&self, side: impl FnOnce() -> A + Send, main: impl FnOnce() -> R) -> (A, R) {
        let mut side = Some(side);
        let mut out = None;
        let mut call = || {
            if let Some(f) = side.take() {
                out = Some(f());
            }
        };
        if self.n_threads == 1 {
            let r = main();
            call();
            return (out.expect("the side task ran"), r);
        }
        let s = &*self.shared;
        // SAFETY: the lifetime is erased only until this call returns, and it returns (or
        // unwinds) only after the side task is taken back unrun or has finished (`side_done`).
        let erased: *mut Side = unsafe { std::mem::transmute::<*mut (dyn FnMut() + Send + '_), *mut Side>(&mut call) };
        {
            let mut slot = s.side.lock().unwrap_or_else(|e| e.into_inner());
            *slot = Some(SidePtr(erased));
            s.side_offered.store(true, Ordering::SeqCst);
        }
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let r = catch_unwind(AssertUnwindSafe(main));
        if let Some(unclaimed) = take_side(s) {
            call_side(s, unclaimed);
        } else {
            let start = Instant::now();
            while !s.side_done.load(Ordering::Acquire) {
                if start.elapsed() > SPIN {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            s.side_done.store(false, Ordering::Relaxed);
        }
        if let Some(p) = s.side_panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
            resume_unwind(p);
        }
        let r = r.unwrap_or_else(|p| resume_unwind(p));
        (out.expect("the side task ran"), r)
    }

    /// Split `0..n` into chunks of `chunk` and hand them out dynamically: `f(tid, range)`.
    pub fn for_chunks(&self, n: usize, chunk: usize, f: &(dyn Fn(usize, std::ops::Range<usize>) + Sync)) {
        let chunk = chunk.max(1);
        let next = AtomicUsize::new(0);
        self.run(&|tid| {
            loop {
                let start = next.fetch_add(chunk, Ordering::Relaxed);
                if start >= n {
                    break;
                }
                f(tid, start..(start + chunk).min(n));
            }
        });
    }
}

impl Pool {
    /// Hand out the rows of several row spaces (space i has `spaces[i].0` rows, cut in
    /// multiples of `spaces[i].1`, its units) so that each thread reads one stretch of them
    /// from front to back: the units of all spaces, one after another, are cut into one part
    /// per thread; a thread takes its own part in shrinking pieces from the front (all but a
    /// sixteenth of what is left, at least one unit), then shrinking pieces from the back of
    /// whichever part has the most left (a quarter of it), until none has. `f(tid, space,
    /// rows)`, `rows` whole units of one space (the last may end at the space's end).
    ///
    /// A product of a few tokens streams its weights from memory, and a thread's pieces that
    /// follow each other in memory keep its stream going: pieces of one shared counter (as
    /// before) alternate between the threads, so every piece began where nothing had been
    /// asked for ahead. On Sapphire Rapids, two threads, one token against packed Q1_0 of 2,048
    /// columns (`examples/gemv_ab`, alternated in one process): matrices of 0.3 / 0.6 / 1.2 MB
    /// (the Bonsai-1.7B shape's layers) ran at 20–21 / 25 / 28 GB/s against 19–19.5 / 22 /
    /// 25.5, larger ones the same; the 1.7B shape decoded 2–4 % faster (tg128, four pairs).
    ///
    /// Each piece costs a little (about 0.4 µs a piece there, though its first lines were asked
    /// for ahead), so a thread's first claim on its own part is nearly all of it and only a
    /// tail is left for sharing: against quarters, matrices of 0.3 / 0.6 / 1.2 / 3.5 MB ran at
    /// 22 / 27–28 / 30–31 / 32–33.5 GB/s instead of 21.5 / 25.5 / 28.3 / 31.4, the 1.7B shape
    /// decoded 115–118 tokens/s instead of 106–110 (tg64, alternated), the 8B shape 1–2 %
    /// faster, and SmolLM2 and eight sequences of the 1.7B shape (`batched-bench`) the same.
    pub fn for_shrinking(&self, spaces: &[(usize, usize)], f: &(dyn Fn(usize, usize, std::ops::Range<usize>) + Sync)) {
        let units = |&(rows, unit): &(usize, usize)| rows.div_ceil(unit.max(1));
        let total: usize = spaces.iter().map(units).sum();
        assert!(total < 1 << 32, "for_shrinking: {total} units");
        let parts = self.n_threads;
        // The one allocation: each part's unclaimed units.
        let bounds: Vec<AtomicU64> =
            (0..parts).map(|p| AtomicU64::new(pack_units(total * p / parts..total * (p + 1) / parts))).collect();
        // Units `us` (over all spaces, one after another) to `f`, cut where spaces end.
        let hand = |tid: usize, us: std::ops::Range<usize>| {
            let mut first = 0;
            for (i, space) in spaces.iter().enumerate() {
                let end = first + units(space);
                let (from, to) = (us.start.max(first), us.end.min(end));
                if from < to {
                    let (rows, unit) = (space.0, space.1.max(1));
                    f(tid, i, (from - first) * unit..((to - first) * unit).min(rows));
                }
                first = end;
            }
        };
        self.run(&|tid| {
            // Its own part from the front, then the others' from the back.
            while let Some(us) = bounds.get(tid).and_then(|own| claim(own, true)) {
                hand(tid, us);
            }
            while let Some(victim) = bounds.iter().max_by_key(|b| unclaimed(b.load(Ordering::Relaxed)).len()) {
                match claim(victim, false) {
                    Some(us) => hand(tid, us),
                    None if unclaimed(victim.load(Ordering::Relaxed)).is_empty() => break,
                    None => {}
                }
            }
        });
    }

    /// Run `f(tid, item)` once for every item of `items`, each item handed to exactly one
    /// thread. This is the one way work writes through disjoint parts of one buffer from
    /// several threads: the exclusive borrow of `items` is split, never shared.
    pub fn for_each_mut<T: Send>(&self, items: &mut [T], f: &(dyn Fn(usize, &mut T) + Sync)) {
        struct Items<T>(*mut T);
        // SAFETY: the pointer is only used to reach distinct items from distinct threads (each
        // index is handed out once by `for_chunks`), and `T: Send` lets an item move to the
        // thread that works on it.
        unsafe impl<T: Send> Sync for Items<T> {}
        let ptr = Items(items.as_mut_ptr());
        let n = items.len();
        self.for_chunks(n, 1, &|tid, range| {
            for i in range {
                let p = &ptr;
                // SAFETY: `i < n`, and no other thread receives index `i` (see above); `items`
                // stays exclusively borrowed until every thread has finished.
                f(tid, unsafe { &mut *p.0.add(i) });
            }
        });
    }
}

/// A part's unclaimed units `front .. back` as one word (front in the high half), so that a
/// claim from either end is one compare-exchange.
fn pack_units(us: std::ops::Range<usize>) -> u64 {
    (us.start as u64) << 32 | us.end as u64
}

fn unclaimed(word: u64) -> std::ops::Range<usize> {
    (word >> 32) as usize..(word & 0xffff_ffff) as usize
}

/// What a thread's claim on its own part leaves for sharing: this fraction of the units left
/// (see [`Pool::for_shrinking`]).
const OWN_TAIL: usize = 16;

/// Take the part's unclaimed units from its front (its own thread: all but a sixteenth, at
/// least one) or a quarter of them (at least one) from its back (another thread); `None` when
/// it has none left.
fn claim(part: &AtomicU64, front: bool) -> Option<std::ops::Range<usize>> {
    let mut word = part.load(Ordering::Relaxed);
    loop {
        let left = unclaimed(word);
        if left.is_empty() {
            return None;
        }
        let (took, rest) = if front {
            let take = left.len() - left.len() / OWN_TAIL;
            (left.start..left.start + take, left.start + take..left.end)
        } else {
            let take = left.len().div_ceil(4);
            (left.end - take..left.end, left.start..left.end - take)
        };
        match part.compare_exchange_weak(word, pack_units(rest), Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some(took),
            Err(now) => word = now,
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _guard = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// One value per pool thread, for scratch space inside a job (indexed by the thread index
/// that [`Pool::run`] passes to the job).
pub struct PerThread<T> {
    slots: Vec<UnsafeCell<T>>,
}

// SAFETY: each slot is only reached through `get`, whose contract gives each thread its own.
unsafe impl<T: Send> Sync for PerThread<T> {}

impl<T> PerThread<T> {
    pub fn new(n_threads: usize, mut make: impl FnMut() -> T) -> PerThread<T> {
        PerThread { slots: (0..n_threads.max(1)).map(|_| UnsafeCell::new(make())).collect() }
    }

    /// Threads it has a slot for.
    pub fn n_threads(&self) -> usize {
        self.slots.len()
    }

    /// The slot of thread `tid`.
    ///
    /// # Safety
    /// Only the pool thread with index `tid` may hold this reference, and only while the job
    /// that received `tid` runs (every thread index of a job is unique).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn get(&self, tid: usize) -> &mut T {
        // SAFETY: by the contract, thread `tid` of the running job is this slot's only user.
        unsafe { &mut *self.slots[tid].get() }
    }

    /// Every slot, when no job is running.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().map(|c| c.get_mut())
    }
}

/// Take the offered side task, if it is still on offer.
fn take_side(s: &Shared) -> Option<SidePtr> {
    let mut slot = s.side.lock().unwrap_or_else(|e| e.into_inner());
    s.side_offered.store(false, Ordering::SeqCst);
    slot.take()
}

/// What woke a waiting worker.
enum Wake {
    Job(u64),
    Side,
    Shutdown,
}

fn worker(s: &Shared, tid: usize) {
    let mut seen = 0u64;
    loop {
        match wait_for_work(s, seen) {
            Wake::Shutdown => return,
            Wake::Side => run_side(s),
            Wake::Job(state) => {
                seen = generation(state);
                if join(s, state) {
                    // SAFETY: joined the open job of this generation (Acquire), whose publisher
                    // stored the closure before opening it and keeps it alive until we leave.
                    let job = unsafe { (*s.job.get()).expect("a published job") };
                    // SAFETY: as above: the closure lives until this worker leaves the job, and
                    // `tid` is this worker's own index (unique within the job).
                    if let Err(p) = catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(tid) })) {
                        *s.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
                    }
                    s.state.fetch_sub(1, Ordering::Release);
                }
            }
        }
    }
}

/// Count this worker into the job of `state`'s generation, unless it is closed or gone.
fn join(s: &Shared, mut state: u64) -> bool {
    let g = generation(state);
    loop {
        if generation(state) != g || state & CLOSED != 0 {
            return false;
        }
        match s.state.compare_exchange_weak(state, state + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(now) => state = now,
        }
    }
}

/// A worker's turn at the side task, if it is still on offer.
fn run_side(s: &Shared) {
    let Some(side) = take_side(s) else { return };
    call_side(s, side);
    s.side_done.store(true, Ordering::Release);
}

/// Run a side task taken from the slot, keeping its panic for [`Pool::beside`] to re-raise.
fn call_side(s: &Shared, side: SidePtr) {
    // SAFETY: `Pool::beside` keeps the closure alive until the task has run (it waits for
    // `side_done`, or runs the task itself), and nobody else has the pointer: it was taken from
    // the slot.
    if let Err(p) = catch_unwind(AssertUnwindSafe(|| unsafe { (*side.0)() })) {
        *s.side_panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
    }
}

/// Spin briefly for work (a generation newer than `seen`, or a side task), then sleep until
/// some arrives.
fn wait_for_work(s: &Shared, seen: u64) -> Wake {
    let ready = || {
        if s.shutdown.load(Ordering::Acquire) {
            return Some(Wake::Shutdown);
        }
        if s.side_offered.load(Ordering::SeqCst) {
            return Some(Wake::Side);
        }
        let state = s.state.load(Ordering::SeqCst);
        (generation(state) != seen && state & CLOSED == 0).then_some(Wake::Job(state))
    };
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if let Some(w) = ready() {
            return w;
        }
        spins += 1;
        if spins.is_multiple_of(64) && start.elapsed() > SPIN {
            break;
        }
        std::hint::spin_loop();
    }
    let mut guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
    s.sleepers.fetch_add(1, Ordering::SeqCst);
    loop {
        if let Some(w) = ready() {
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            return w;
        }
        guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_caller_runs_every_job_and_no_thread_twice() {
        let pool = Pool::new(3);
        for _ in 0..1000 {
            let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|tid| {
                hits[tid].fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(hits[0].load(Ordering::Relaxed), 1);
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) <= 1));
        }
    }

    #[test]
    fn chunks_cover_the_range_once() {
        let pool = Pool::new(2);
        let seen: Vec<AtomicUsize> = (0..1001).map(|_| AtomicUsize::new(0)).collect();
        pool.for_chunks(1001, 7, &|_, r| {
            for i in r {
                seen[i].fetch_add(1, Ordering::Relaxed);
            }
        });
        assert!(seen.iter().all(|c| c.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn shrinking_pieces_cover_each_space_once_in_whole_units() {
        for threads in [1, 2, 3] {
            let pool = Pool::new(threads);
            // A space shorter than its unit, one that ends inside a unit, and an empty one.
            let spaces = [(1000, 16), (7, 16), (0, 64), (4096, 64), (530, 32)];
            let seen: Vec<Vec<AtomicUsize>> =
                spaces.iter().map(|s| (0..s.0).map(|_| AtomicUsize::new(0)).collect()).collect();
            let pieces = AtomicUsize::new(0);
            pool.for_shrinking(&spaces, &|_, i, r| {
                assert!(r.start.is_multiple_of(spaces[i].1) && !r.is_empty() && r.end <= spaces[i].0);
                assert!(r.end == spaces[i].0 || r.len().is_multiple_of(spaces[i].1), "{r:?} of space {i}");
                pieces.fetch_add(1, Ordering::Relaxed);
                for j in r {
                    seen[i][j].fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(seen.iter().flatten().all(|c| c.load(Ordering::Relaxed) == 1));
            // Shrinking: far fewer pieces than units.
            assert!(pieces.load(Ordering::Relaxed) < 100, "{} pieces", pieces.load(Ordering::Relaxed));
        }
    }

    #[test]
    fn claims_take_nearly_all_from_the_front_and_quarters_from_the_back() {
        let part = AtomicU64::new(pack_units(10..110));
        assert_eq!(claim(&part, false), Some(85..110));
        assert_eq!(claim(&part, true), Some(10..81));
        assert_eq!(unclaimed(part.load(Ordering::Relaxed)), 81..85);
        assert_eq!(claim(&part, false), Some(84..85));
        let mut got = vec![10..81, 84..85, 85..110];
        while let Some(us) = claim(&part, got.len() % 2 == 0) {
            got.push(us);
        }
        got.sort_by_key(|r| r.start);
        assert!(got.windows(2).all(|w| w[0].end == w[1].start) && got.last().unwrap().end == 110);
        assert_eq!(claim(&part, true), None);
    }

    #[test]
    fn one_thread_takes_every_piece_in_order() {
        let pool = Pool::new(1);
        let pieces = Mutex::new(Vec::new());
        pool.for_shrinking(&[(1000, 16), (64, 64), (530, 32)], &|_, i, r| pieces.lock().unwrap().push((i, r)));
        let pieces = pieces.into_inner().unwrap();
        let flat: Vec<(usize, usize)> = pieces.iter().flat_map(|(i, r)| r.clone().map(move |x| (*i, x))).collect();
        let want: Vec<(usize, usize)> =
            [(0, 1000), (1, 64), (2, 530)].iter().flat_map(|&(i, n)| (0..n).map(move |x| (i, x))).collect();
        assert_eq!(flat, want);
    }

    #[test]
    fn each_item_goes_to_one_thread() {
        let pool = Pool::new(3);
        let mut items: Vec<usize> = vec![0; 1001];
        pool.for_each_mut(&mut items, &|_, x| *x += 1);
        assert!(items.iter().all(|&x| x == 1));
        pool.for_each_mut(&mut Vec::<u8>::new(), &|_, _| unreachable!());
    }

    /// Run a job in which the caller waits (up to 5 s) until a worker has joined and run `f`.
    fn with_a_worker(pool: &Pool, f: &(dyn Fn(usize) + Sync)) -> bool {
        let joined = AtomicBool::new(false);
        pool.run(&|tid| {
            if tid == 0 {
                let t = Instant::now();
                while !joined.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(5) {
                    std::hint::spin_loop();
                }
            } else {
                joined.store(true, Ordering::Release);
                f(tid);
            }
        });
        joined.load(Ordering::Acquire)
    }

    #[test]
    fn sleeping_workers_wake_up() {
        let pool = Pool::new(2);
        assert!(with_a_worker(&pool, &|_| {}));
        std::thread::sleep(Duration::from_millis(20));
        assert!(with_a_worker(&pool, &|_| {}));
    }

    #[test]
    fn a_worker_panic_reaches_the_caller() {
        let pool = Pool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| with_a_worker(&pool, &|tid| assert_ne!(tid, 1, "boom"))));
        assert!(r.is_err());
        pool.run(&|_| {});
    }

    #[test]
    fn a_side_task_runs_beside_the_jobs() {
        // Miri interprets every step: a few rounds there.
        let rounds = if cfg!(miri) { 4 } else { 200 };
        for threads in [1, 2, 3] {
            let pool = Pool::new(threads);
            for round in 0..rounds {
                let data: Vec<u64> = (0..round).collect();
                let (sum, covered) = pool.beside(
                    || data.iter().sum::<u64>(),
                    || {
                        let seen: Vec<AtomicUsize> = (0..517).map(|_| AtomicUsize::new(0)).collect();
                        for _ in 0..5 {
                            pool.for_chunks(517, 3, &|_, r| {
                                r.for_each(|i| _ = seen[i].fetch_add(1, Ordering::Relaxed))
                            });
                        }
                        seen.iter().all(|c| c.load(Ordering::Relaxed) == 5)
                    },
                );
                assert_eq!(sum, (0..round).sum::<u64>());
                assert!(covered);
            }
        }
    }

    #[test]
    fn jobs_go_on_while_a_worker_is_away() {
        const JOBS: usize = if cfg!(miri) { 5 } else { 100 };
        // The only worker is busy with the side task until the caller's jobs are done.
        let pool = Pool::new(2);
        let released = AtomicBool::new(false);
        let (took, jobs) = pool.beside(
            || {
                let t = Instant::now();
                while !released.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                t.elapsed()
            },
            || {
                let n = AtomicUsize::new(0);
                for _ in 0..JOBS {
                    pool.for_chunks(10, 1, &|_, _| _ = n.fetch_add(1, Ordering::Relaxed));
                }
                released.store(true, Ordering::Release);
                n.load(Ordering::Relaxed)
            },
        );
        assert_eq!(jobs, 10 * JOBS);
        assert!(took > Duration::ZERO);
    }

    #[test]
    fn a_side_task_panic_reaches_the_caller() {
        let pool = Pool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| pool.beside(|| panic!("boom"), || 1)));
        assert!(r.is_err());
        assert_eq!(pool.beside(|| 2, || 3), (2, 3));
    }
}
