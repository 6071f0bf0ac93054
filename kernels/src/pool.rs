//! A persistent thread pool: `run(f)` calls `f(thread_index, n_threads)` on every thread (the
//! caller is thread 0) and returns when all are done.

use std::sync::{Arc, Condvar, Mutex};

type Job = &'static (dyn Fn(usize, usize) + Sync);

struct Shared {
    state: Mutex<State>,
    start: Condvar,
    done: Condvar,
}

struct State {
    job: Option<Job>,
    generation: u64,
    pending: usize,
    shutdown: bool,
}

pub struct ThreadPool {
    n: usize,
    shared: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl ThreadPool {
    /// A pool of `n` threads in all (the caller counts as one); `0` means the number of cores.
    pub fn new(n: usize) -> Self {
        let n = if n == 0 { std::thread::available_parallelism().map_or(1, |p| p.get()) } else { n };
        let shared = Arc::new(Shared {
            state: Mutex::new(State { job: None, generation: 0, pending: 0, shutdown: false }),
            start: Condvar::new(),
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
        Self { n, shared, workers }
    }

    pub fn n_threads(&self) -> usize {
        self.n
    }

    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        if self.n == 1 {
            f(0, 1);
            return;
        }
        // SAFETY: the job reference is only used until every worker has reported done, which
        // this function waits for before returning, so the borrow outlives all uses.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), Job>(f) };
        {
            let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            st.job = Some(job);
            st.generation += 1;
            st.pending = self.n - 1;
        }
        self.shared.start.notify_all();
        f(0, self.n);
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        while st.pending > 0 {
            st = self.shared.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.job = None;
    }
}

fn worker(shared: &Shared, tid: usize, n: usize) {
    let mut seen = 0u64;
    loop {
        let job = {
            let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            while st.generation == seen && !st.shutdown {
                st = shared.start.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.shutdown {
                return;
            }
            seen = st.generation;
            st.job
        };
        if let Some(f) = job {
            f(tid, n);
        }
        let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        st.pending -= 1;
        if st.pending == 0 {
            shared.done.notify_one();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner()).shutdown = true;
        self.shared.start.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
