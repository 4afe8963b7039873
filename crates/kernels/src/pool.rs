//! A lean thread pool for the forward pass: one job at a time, run by every thread at once.
//!
//! A token of an 8B model is ~250 matrix products, so the handoff between them must cost
//! microseconds, not the tens of microseconds a general task scheduler spends. Here the caller
//! publishes a job (a borrowed closure) by bumping a generation counter; workers that are
//! spinning see it at once, workers that were parked are woken; the caller runs its own share
//! and spins until the others finish. Nothing is allocated per job. Workers spin only briefly
//! after a job and then sleep on a condition variable, so an idle pool costs nothing.

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker keeps spinning before it parks.
const SPIN: Duration = Duration::from_micros(300);

type Job = dyn Fn(usize) + Sync;

struct Shared {
    /// The current job, valid while `remaining > 0` for the generation it was published with.
    job: UnsafeCell<Option<*const Job>>,
    generation: AtomicU64,
    remaining: AtomicUsize,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    busy: AtomicBool,
}

// SAFETY: `job` is written only by the publishing thread while no worker reads it (all workers
// have finished the previous generation), and read by workers only between a generation bump
// (Release/Acquire on `generation`) and their decrement of `remaining`.
unsafe impl Sync for Shared {}
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
            generation: AtomicU64::new(0),
            remaining: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            panic: Mutex::new(None),
            busy: AtomicBool::new(false),
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

    /// Run `f(thread_index)` on every thread of the pool and return when all have finished.
    /// A panic in any thread is re-raised here.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.n_threads == 1 {
            f(0);
            return;
        }
        let s = &*self.shared;
        assert!(!s.busy.swap(true, Ordering::Acquire), "Pool::run is not reentrant");
        // SAFETY: no worker is running a job (the previous `run` waited for all of them), so
        // nobody reads `job` now. The lifetime is erased only until this call returns, and
        // this call does not return before every worker has stopped using the pointer.
        unsafe {
            let erased: *const Job = std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Job>(f);
            *s.job.get() = Some(erased);
        }
        s.remaining.store(self.n_threads - 1, Ordering::Relaxed);
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        while s.remaining.load(Ordering::Acquire) != 0 {
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

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
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
        unsafe { &mut *self.slots[tid].get() }
    }

    /// Every slot, when no job is running.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().map(|c| c.get_mut())
    }
}

fn worker(s: &Shared, tid: usize) {
    let mut seen = 0u64;
    loop {
        let generation = wait_for_job(s, seen);
        seen = generation;
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: the generation bump (Acquire above) happened after the job was stored, and
        // the publisher keeps the closure alive until `remaining` reaches zero.
        let job = unsafe { (*s.job.get()).expect("a published job") };
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(tid) })) {
            *s.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        }
        s.remaining.fetch_sub(1, Ordering::Release);
    }
}

/// Spin briefly for a generation newer than `seen`, then sleep until one arrives.
fn wait_for_job(s: &Shared, seen: u64) -> u64 {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let g = s.generation.load(Ordering::Acquire);
        if g != seen {
            return g;
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
        let g = s.generation.load(Ordering::SeqCst);
        if g != seen {
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            return g;
        }
        guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_every_job() {
        let pool = Pool::new(3);
        let hits = AtomicUsize::new(0);
        for _ in 0..1000 {
            pool.run(&|_| {
                hits.fetch_add(1, Ordering::Relaxed);
            });
        }
        assert_eq!(hits.load(Ordering::Relaxed), 3000);
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
    fn each_item_goes_to_one_thread() {
        let pool = Pool::new(3);
        let mut items: Vec<usize> = vec![0; 1001];
        pool.for_each_mut(&mut items, &|_, x| *x += 1);
        assert!(items.iter().all(|&x| x == 1));
        pool.for_each_mut(&mut Vec::<u8>::new(), &|_, _| unreachable!());
    }

    #[test]
    fn sleeping_workers_wake_up() {
        let pool = Pool::new(2);
        let hits = AtomicUsize::new(0);
        pool.run(&|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        std::thread::sleep(Duration::from_millis(20));
        pool.run(&|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn a_worker_panic_reaches_the_caller() {
        let pool = Pool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| pool.run(&|tid| assert_ne!(tid, 1, "boom"))));
        assert!(r.is_err());
        pool.run(&|_| {});
    }
}
