//! The thread pool: every index runs exactly once per call, many calls in a row, concurrent
//! callers, and a panicking job neither deadlocks nor poisons the pool.

use std::sync::atomic::{AtomicUsize, Ordering};

use tpslab_kernels::ThreadPool;

#[test]
fn every_thread_index_runs_once_per_call() {
    for n in [1, 2, 3, 5] {
        let pool = ThreadPool::new(n);
        assert_eq!(pool.n_threads(), n);
        let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..2000 {
            pool.run(&|tid, nth| {
                assert_eq!(nth, n);
                counts[tid].fetch_add(1, Ordering::Relaxed);
            });
        }
        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 2000));
    }
}

#[test]
fn work_split_covers_all_items() {
    let pool = ThreadPool::new(3);
    for total in [0usize, 1, 2, 7, 100, 1001] {
        let hits: Vec<AtomicUsize> = (0..total).map(|_| AtomicUsize::new(0)).collect();
        pool.run(&|tid, nth| {
            let per = total.div_ceil(nth);
            for h in hits
                .iter()
                .take(((tid + 1) * per).min(total))
                .skip(tid * per)
            {
                h.fetch_add(1, Ordering::Relaxed);
            }
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
    }
}

#[test]
fn sleeping_workers_wake_up() {
    let pool = ThreadPool::new(2);
    let c = AtomicUsize::new(0);
    for _ in 0..5 {
        // Longer than the spin window, so workers park on the condvar in between.
        std::thread::sleep(std::time::Duration::from_millis(2));
        pool.run(&|_, _| {
            c.fetch_add(1, Ordering::Relaxed);
        });
    }
    assert_eq!(c.load(Ordering::Relaxed), 10);
}

#[test]
fn concurrent_callers_are_serialized() {
    let pool = ThreadPool::new(3);
    let c = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..200 {
                    pool.run(&|_, _| {
                        c.fetch_add(1, Ordering::Relaxed);
                    });
                }
            });
        }
    });
    assert_eq!(c.load(Ordering::Relaxed), 4 * 200 * 3);
}

#[test]
fn panics_propagate_without_deadlock() {
    let pool = ThreadPool::new(3);
    for bad in 0..3 {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(&|tid, _| {
                if tid == bad {
                    panic!("job failure on thread {tid}");
                }
            });
        }));
        assert!(r.is_err(), "panic on thread {bad} was not reported");
    }
    // The pool still works afterwards.
    let c = AtomicUsize::new(0);
    pool.run(&|_, _| {
        c.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(c.load(Ordering::Relaxed), 3);
}
