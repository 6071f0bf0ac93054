//! A persistent thread pool: `run(f)` calls `f(thread_index, n_threads)` on every thread (the
//! caller is thread 0) and returns when all are done.
//!
//! A model step makes hundreds of short `run` calls, so dispatch must cost well under a
//! microsecond: workers watch an atomic generation counter, spinning for a short while
//! (`SPIN`) after each job before parking on a condvar; the caller likewise spins briefly for
//! the last worker before sleeping. Nobody busy-waits longer than that.

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

type Job = &'static (dyn Fn(usize, usize) + Sync);

/// How long an idle worker (or the waiting caller) spins before sleeping.
const SPIN: Duration = Duration::from_micros(50);
/// How long of that spinning is without yielding the core.
const PURE_SPIN: Duration = Duration::from_micros(5);

struct Shared {
    generation: AtomicU64,
    /// Written by `run` only while every worker is idle (`pending == 0`), read by workers after
    /// they see a new generation.
    job: UnsafeCell<Option<Job>>,
    pending: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    caller_waiting: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
    done: Condvar,
}

// SAFETY: `job` is only written while no worker reads it (see the field doc); everything else
// is atomics and std sync types.
unsafe impl Sync for Shared {}

pub struct ThreadPool {
    n: usize,
    shared: Arc<Shared>,
    /// Serializes `run` calls from different threads.
    run_lock: Mutex<()>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

fn lock(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Spins until `done()` or `SPIN` has passed; returns whether `done()` became true. After the
/// first few microseconds it yields between checks, so on an oversubscribed machine the thread
/// we wait for (often our own peer) gets the core instead of us burning it.
fn spin_until(done: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            if done() {
                return true;
            }
            std::hint::spin_loop();
        }
        let t = start.elapsed();
        if t > SPIN {
            return done();
        }
        if t > PURE_SPIN {
            std::thread::yield_now();
        }
    }
}

impl ThreadPool {
    /// A pool of `n` threads in all (the caller counts as one); `0` means the number of cores.
    pub fn new(n: usize) -> Self {
        let n = if n == 0 {
            std::thread::available_parallelism().map_or(1, |p| p.get())
        } else {
            n
        };
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            caller_waiting: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            done: Condvar::new(),
        });
        let workers = (1..n)
            .map(|tid| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("tpslab-kernel-{tid}"))
                    .spawn(move || worker(&shared, tid, n))
                    .expect("spawning a kernel thread")
            })
            .collect();
        Self {
            n,
            shared,
            run_lock: Mutex::new(()),
            workers,
        }
    }

    pub fn n_threads(&self) -> usize {
        self.n
    }

    /// Runs `f(tid, n_threads)` on every thread and waits for all. If `f` panics on any
    /// thread, the others still finish and then `run` panics.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        if self.n == 1 {
            f(0, 1);
            return;
        }
        let _serial = lock(&self.run_lock);
        let sh = &*self.shared;
        // SAFETY: the job reference is only used until every worker has reported done, which
        // this function waits for before returning (also when `f` panics), so the borrow
        // outlives all uses.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), Job>(f) };
        // SAFETY: all workers finished the previous job (`pending == 0`) and read `job` only
        // after seeing the generation bump below.
        unsafe { *sh.job.get() = Some(job) };
        sh.panicked.store(false, SeqCst);
        sh.pending.store(self.n - 1, SeqCst);
        sh.generation.fetch_add(1, SeqCst);
        if sh.sleepers.load(SeqCst) > 0 {
            let _g = lock(&sh.lock);
            sh.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0, self.n)));
        if !spin_until(|| sh.pending.load(SeqCst) == 0) {
            let mut g = lock(&sh.lock);
            sh.caller_waiting.store(true, SeqCst);
            while sh.pending.load(SeqCst) != 0 {
                g = sh.done.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            sh.caller_waiting.store(false, SeqCst);
        }
        if let Err(p) = mine {
            resume_unwind(p);
        }
        assert!(!sh.panicked.load(SeqCst), "a thread pool job panicked");
    }
}

fn worker(sh: &Shared, tid: usize, n: usize) {
    let mut seen = 0u64;
    loop {
        if !spin_until(|| sh.generation.load(SeqCst) != seen) {
            let mut g = lock(&sh.lock);
            sh.sleepers.fetch_add(1, SeqCst);
            while sh.generation.load(SeqCst) == seen {
                g = sh.wake.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            sh.sleepers.fetch_sub(1, SeqCst);
        }
        seen = sh.generation.load(SeqCst);
        if sh.shutdown.load(SeqCst) {
            return;
        }
        // SAFETY: `run` wrote the job before bumping the generation and keeps it (and what it
        // borrows) alive until `pending` reaches 0, which happens only after this call.
        if let Some(f) = unsafe { *sh.job.get() }
            && catch_unwind(AssertUnwindSafe(|| f(tid, n))).is_err()
        {
            sh.panicked.store(true, SeqCst);
        }
        if sh.pending.fetch_sub(1, SeqCst) == 1 && sh.caller_waiting.load(SeqCst) {
            let _g = lock(&sh.lock);
            sh.done.notify_all();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, SeqCst);
        sh.generation.fetch_add(1, SeqCst);
        {
            let _g = lock(&sh.lock);
            sh.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
