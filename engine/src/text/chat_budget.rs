//! Budgets for rendering a chat template: fuel, output size, time and memory, and the isolated
//! render that enforces the last two.
//!
//! A chat template is a program that comes inside a model file. minijinja's fuel stops one that
//! loops (`range(100000)` three deep) and a capped writer stops one that prints without end, but
//! neither can stop one that doubles a string in a loop or a macro (`ns.s ~ ns.s`, 40 times: each
//! step is one instruction, the 35th asks for 16 GiB) or spends its time inside one builtin. On
//! Linux the render therefore runs in a forked copy of the process with an address-space limit,
//! and the caller waits for its answer on a pipe with a deadline: a runaway child is killed and
//! the caller gets a clear error, whatever the template did. Elsewhere the render runs in
//! process with fuel and the output cap only.
//!
//! The child runs only the render (no locks other threads may hold, no I/O but its pipe) and
//! leaves with `_exit`. A fork costs in proportion to the memory of the process it copies (~4 ms
//! at 100 MB, ~210 ms with 4 GiB resident), so a binary starts the render server of
//! `chat_zygote.rs` first ([`start_server`]): renders are then children of that small process,
//! under 1 ms each whatever model is loaded; without it (tests, libraries) they fork from here.

use std::time::Duration;

use serde::{Deserialize, Serialize};

#[cfg(target_os = "linux")]
#[path = "chat_zygote.rs"]
mod zygote;

/// What one render of a chat template may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenderBudget {
    /// minijinja instructions (its `fuel`): a real template renders a long conversation in a few
    /// hundred thousand.
    pub fuel: u64,
    /// Bytes of rendered prompt.
    pub max_output: usize,
    /// Wall-clock time for the whole render.
    pub time_limit: Duration,
    /// Memory the render may allocate beyond what the process already has (Linux only).
    pub max_memory: usize,
}

impl Default for RenderBudget {
    fn default() -> Self {
        Self {
            fuel: 20_000_000,
            max_output: 16 << 20,
            time_limit: Duration::from_secs(5),
            max_memory: 512 << 20,
        }
    }
}

/// Which limit a render ran past.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Overrun {
    Fuel(u64),
    Output(usize),
    Time(Duration),
    /// Macro, include or loop recursion deeper than this.
    Depth(usize),
    /// The isolated render died: out of its memory limit, or a crash (the signal is named).
    Died {
        memory: usize,
        signal: i32,
    },
}

impl std::fmt::Display for Overrun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fuel(n) => write!(
                f,
                "it ran past its budget of {n} template steps (a loop that does not end?)"
            ),
            Self::Output(n) => write!(f, "its output passed the limit of {} MiB", n >> 20),
            Self::Time(t) => write!(f, "it ran past its time limit of {:.1} s", t.as_secs_f64()),
            Self::Depth(n) => write!(f, "it recursed deeper than {n} levels"),
            Self::Died { memory, signal } if *signal == SIGABRT => write!(
                f,
                "it needed more than its memory limit of {} MiB (a string or list that keeps doubling?)",
                memory >> 20
            ),
            // Through the render server the signal is not known.
            Self::Died { memory, signal: 0 } => write!(
                f,
                "it needed more than its memory limit of {} MiB, or crashed",
                memory >> 20
            ),
            Self::Died { signal, .. } => {
                write!(
                    f,
                    "the render crashed (signal {signal}; too deep a recursion?)"
                )
            }
        }
    }
}

/// SIGABRT: what a failed allocation ends a Rust process with.
const SIGABRT: i32 = 6;

/// How an in-process render ended, in a form that crosses the pipe from the child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendered {
    Text(String),
    /// The template's own `raise_exception` message.
    Rejected(String),
    /// minijinja's error text (syntax or runtime).
    Failed(String),
    Over(Overrun),
}

/// Runs a render under `budget`'s time and memory limits. On Linux: `job()` (made only then) through the render
/// server when one was started ([`start_server`]), else `render` in a child forked here. Elsewhere
/// `render` runs here (where only the fuel and output limits inside it hold).
pub fn isolated(
    budget: &RenderBudget,
    job: impl FnOnce() -> Vec<u8>,
    render: impl FnOnce() -> Rendered,
) -> Rendered {
    #[cfg(target_os = "linux")]
    {
        zygote::render(budget, job).unwrap_or_else(|| linux::isolated(budget, render))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (budget, job);
        render()
    }
}

/// Starts the render server (Linux; see `chat_zygote.rs`): call it first thing in `main`, while
/// the process is small and has one thread, so that later renders fork from a small process
/// whatever model is loaded. `runner` turns a job's bytes into its answer. Returns whether one
/// runs.
pub fn start_server(runner: fn(&[u8]) -> Rendered) -> bool {
    #[cfg(target_os = "linux")]
    {
        zygote::start(runner)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = runner;
        false
    }
}

/// The child's answer on the pipe: one tag byte, then the text (or, for an overrun, its number).
fn encode(r: &Rendered) -> Vec<u8> {
    let (tag, body): (u8, String) = match r {
        Rendered::Text(t) => (b'T', t.clone()),
        Rendered::Rejected(m) => (b'R', m.clone()),
        Rendered::Failed(m) => (b'F', m.clone()),
        Rendered::Over(Overrun::Fuel(n)) => (b'f', n.to_string()),
        Rendered::Over(Overrun::Output(n)) => (b'o', n.to_string()),
        Rendered::Over(Overrun::Time(t)) => (b't', t.as_millis().to_string()),
        Rendered::Over(Overrun::Depth(n)) => (b'r', n.to_string()),
        Rendered::Over(Overrun::Died { memory, signal }) => (b'd', format!("{memory} {signal}")),
    };
    let mut out = Vec::with_capacity(body.len() + 1);
    out.push(tag);
    out.extend_from_slice(body.as_bytes());
    out
}

/// Reads the child's answer; None when it is not one (cut short, or not what `encode` writes).
fn decode(bytes: &[u8]) -> Option<Rendered> {
    let (&tag, rest) = bytes.split_first()?;
    let text = std::str::from_utf8(rest).ok()?.to_string();
    let num = |s: &str| s.parse::<u64>().ok();
    Some(match tag {
        b'T' => Rendered::Text(text),
        b'R' => Rendered::Rejected(text),
        b'F' => Rendered::Failed(text),
        b'f' => Rendered::Over(Overrun::Fuel(num(&text)?)),
        b'o' => Rendered::Over(Overrun::Output(usize::try_from(num(&text)?).ok()?)),
        b't' => Rendered::Over(Overrun::Time(Duration::from_millis(num(&text)?))),
        b'r' => Rendered::Over(Overrun::Depth(usize::try_from(num(&text)?).ok()?)),
        b'd' => {
            let (m, s) = text.split_once(' ')?;
            Rendered::Over(Overrun::Died {
                memory: m.parse().ok()?,
                signal: s.parse().ok()?,
            })
        }
        _ => return None,
    })
}

#[cfg(target_os = "linux")]
mod linux {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::time::Instant;

    use super::{Overrun, RenderBudget, Rendered, decode, encode};

    /// The answer's longest possible size: the output cap, its tag, and room for an error text.
    pub(super) fn answer_cap(budget: &RenderBudget) -> usize {
        budget.max_output.saturating_add(64 << 10)
    }

    /// The process's address-space size now, from /proc.
    pub(super) fn address_space() -> Option<u64> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = statm.split_whitespace().next()?.parse().ok()?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        pages.checked_mul(u64::try_from(page).ok()?)
    }

    pub(super) fn isolated(budget: &RenderBudget, render: impl FnOnce() -> Rendered) -> Rendered {
        let limit = address_space().map(|n| n.saturating_add(budget.max_memory as u64));
        let mut fds = [0i32; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return render();
        }
        // SAFETY: pipe2 succeeded, so both are open descriptors that nothing else owns.
        let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), fds[1]) };
        // SAFETY: fork has no preconditions; the child below runs only the render (its own data,
        // the allocator, which glibc keeps usable across fork) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            // SAFETY: write_end is ours and open.
            unsafe { libc::close(write_end) };
            return render();
        }
        if pid == 0 {
            drop(read_end);
            child(write_end, limit, render);
        }
        // SAFETY: the parent's copy of the write end is ours and open.
        unsafe { libc::close(write_end) };
        let answer = collect(read_end, budget, || {
            // SAFETY: pid is our child, not yet reaped, so the id is still its own.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        });
        let mut status = 0;
        // SAFETY: pid is our child; waiting reaps it whether it exited or was killed.
        unsafe { libc::waitpid(pid, &raw mut status, 0) };
        answer.rendered(
            budget,
            libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        )
    }

    /// Keeps only `fd` open (as fd 3) and points stdin, stdout and stderr at /dev/null: a failed
    /// allocation prints a line before it aborts, and nothing of the parent's (sockets, files,
    /// pipes) stays open here.
    pub(super) fn keep_only(fd: i32) {
        // SAFETY: plain syscalls on this (child) process's own descriptors.
        unsafe {
            if libc::dup2(fd, 3) == 3 {
                libc::close_range(4, u32::MAX, 0);
            }
            // Nor the parent's stdin and stdout: a caller waiting for the end of the app's output
            // must not wait for a render child (or the render server) too.
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            if null >= 0 {
                for std_fd in 0..=2 {
                    libc::dup2(null, std_fd);
                }
            }
        }
    }

    /// Sets this process's address-space limit.
    pub(super) fn limit_memory(limit: Option<u64>) {
        if let Some(limit) = limit {
            let rl = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            // SAFETY: a valid rlimit for this process.
            unsafe { libc::setrlimit(libc::RLIMIT_AS, &raw const rl) };
        }
    }

    /// The child: no other fd than its pipe, an address-space limit, the render, its answer.
    fn child(write_end: i32, limit: Option<u64>, render: impl FnOnce() -> Rendered) -> ! {
        keep_only(write_end);
        limit_memory(limit);
        answer(render)
    }

    /// Runs `render` and writes its answer to fd 3, then ends this (child) process.
    pub(super) fn answer(render: impl FnOnce() -> Rendered) -> ! {
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(render))
            .unwrap_or_else(|_| Rendered::Failed("the template renderer panicked".into()));
        let bytes = encode(&out);
        let mut left = &bytes[..];
        while !left.is_empty() {
            // SAFETY: fd 3 is the pipe's write end; `left` is valid for its length.
            let n = unsafe { libc::write(3, left.as_ptr().cast(), left.len()) };
            if n <= 0 {
                break;
            }
            left = &left[n.unsigned_abs()..];
        }
        // SAFETY: ends the child without running the parent's exit handlers or destructors.
        unsafe { libc::_exit(0) }
    }

    pub(super) enum Answer {
        Whole(Vec<u8>),
        TooLong,
        TimedOut,
    }

    impl Answer {
        /// What the child's answer means; an unreadable one is a child that died, of `signal`
        /// where it is known (0 where it is not: a child of the render server).
        pub(super) fn rendered(self, budget: &RenderBudget, signal: Option<i32>) -> Rendered {
            match self {
                Answer::Whole(bytes) => decode(&bytes).unwrap_or(Rendered::Over(Overrun::Died {
                    memory: budget.max_memory,
                    signal: signal.unwrap_or(0),
                })),
                Answer::TooLong => Rendered::Over(Overrun::Output(budget.max_output)),
                Answer::TimedOut => Rendered::Over(Overrun::Time(budget.time_limit)),
            }
        }
    }

    /// Reads the child's answer until it closes its end, calling `kill` past the deadline or the
    /// size cap.
    pub(super) fn collect(read_end: OwnedFd, budget: &RenderBudget, kill: impl Fn()) -> Answer {
        use std::os::fd::AsRawFd;
        let deadline = Instant::now() + budget.time_limit;
        let cap = answer_cap(budget);
        let fd = read_end.as_raw_fd();
        let mut file = std::fs::File::from(read_end);
        let mut bytes = Vec::new();
        let mut chunk = vec![0u8; 64 << 10];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                kill();
                return Answer::TimedOut;
            }
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd.
            let ready = unsafe { libc::poll(&raw mut pfd, 1, ms) };
            if ready <= 0 {
                continue; // timed out (checked above) or interrupted
            }
            match file.read(&mut chunk) {
                Ok(0) => return Answer::Whole(bytes),
                Ok(n) => {
                    bytes.extend_from_slice(&chunk[..n]);
                    if bytes.len() > cap {
                        kill();
                        return Answer::TooLong;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Answer::Whole(bytes),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_cross_the_pipe_unchanged() {
        for r in [
            Rendered::Text("héllo\n<|im_start|>".into()),
            Rendered::Text(String::new()),
            Rendered::Rejected("roles must alternate".into()),
            Rendered::Failed("syntax error".into()),
            Rendered::Over(Overrun::Fuel(7)),
            Rendered::Over(Overrun::Output(1 << 20)),
            Rendered::Over(Overrun::Time(Duration::from_millis(1500))),
            Rendered::Over(Overrun::Depth(500)),
            Rendered::Over(Overrun::Died {
                memory: 1 << 29,
                signal: 6,
            }),
        ] {
            assert_eq!(decode(&encode(&r)), Some(r));
        }
        assert_eq!(decode(b""), None);
        assert_eq!(decode(b"fxyz"), None);
        assert_eq!(decode(b"?abc"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_child_that_hangs_is_killed_at_the_deadline() {
        let budget = RenderBudget {
            time_limit: Duration::from_millis(300),
            ..RenderBudget::default()
        };
        let t = std::time::Instant::now();
        let r = isolated(&budget, Vec::new, || {
            loop {
                std::hint::spin_loop();
            }
        });
        assert_eq!(r, Rendered::Over(Overrun::Time(budget.time_limit)));
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_child_past_its_memory_limit_dies_alone() {
        let budget = RenderBudget {
            max_memory: 64 << 20,
            ..RenderBudget::default()
        };
        let r = isolated(&budget, Vec::new, || {
            let mut v: Vec<Vec<u8>> = Vec::new();
            loop {
                v.push(vec![1u8; 16 << 20]);
                std::hint::black_box(&v);
            }
        });
        assert_eq!(
            r,
            Rendered::Over(Overrun::Died {
                memory: 64 << 20,
                signal: SIGABRT
            })
        );
        // This process is untouched: the same allocation works here.
        let here = vec![1u8; 128 << 20];
        assert_eq!(here.len(), 128 << 20);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_child_answer_past_the_cap_is_cut() {
        let budget = RenderBudget {
            max_output: 1 << 20,
            ..RenderBudget::default()
        };
        let r = isolated(&budget, Vec::new, || Rendered::Text("x".repeat(4 << 20)));
        assert_eq!(r, Rendered::Over(Overrun::Output(1 << 20)));
        let ok = isolated(&budget, Vec::new, || Rendered::Text("y".repeat(1000)));
        assert_eq!(ok, Rendered::Text("y".repeat(1000)));
    }
}
