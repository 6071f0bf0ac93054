//! The render server (Linux): a small process forked once at start-up, before any model is in
//! memory, that forks one limited child per render.
//!
//! Why: a fork costs time in proportion to the memory the forking process holds (its page tables
//! are copied and every page is marked copy-on-write): ~0.7 ms for a small process, ~60 ms with
//! 1 GiB resident, ~190 ms with 4 GiB (a 7B model on the CPU). Forked from the server instead,
//! each render costs about the small figure whatever the model.
//!
//! Protocol: the app keeps one end of a `SOCK_SEQPACKET` pair; each render makes a stream
//! socket pair and sends one end, with the budget, as one message (`SCM_RIGHTS`). The server forks
//! a child that takes that socket as fd 3, limits its address space and CPU time, reads the job
//! (8-byte length, then the bytes), runs the registered runner and answers as a directly forked
//! child does. The caller reads the answer with its deadline; a child past it dies of its CPU
//! limit. When the server is gone (or was never started) [`render`] says so and the caller forks
//! directly.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use super::linux::{address_space, answer, collect, keep_only, limit_memory};
use super::{Overrun, RenderBudget, Rendered};

/// Runs one job's bytes (the renderer the app registered).
pub type Runner = fn(&[u8]) -> Rendered;

struct Server {
    control: Option<OwnedFd>,
    alive: AtomicBool,
}

static SERVER: OnceLock<Server> = OnceLock::new();

/// Starts the render server once; call it first thing in `main`, while the process is small and
/// has one thread. Returns whether a server is running.
pub fn start(runner: Runner) -> bool {
    SERVER
        .get_or_init(|| {
            let mut fds = [0i32; 2];
            // SAFETY: `fds` is a valid array of two ints for socketpair to fill.
            let ok = unsafe {
                libc::socketpair(
                    libc::AF_UNIX,
                    libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                    0,
                    fds.as_mut_ptr(),
                )
            } == 0;
            // SAFETY: fork at start-up; the child runs only `serve` and leaves with _exit.
            let pid = if ok { unsafe { libc::fork() } } else { -1 };
            if pid == 0 {
                serve(fds[1], runner);
            }
            // SAFETY: both fds are ours when socketpair succeeded; the server keeps its own copy.
            let control = ok.then(|| unsafe {
                libc::close(fds[1]);
                OwnedFd::from_raw_fd(fds[0])
            });
            Server {
                control,
                alive: AtomicBool::new(ok && pid > 0),
            }
        })
        .alive
        .load(Ordering::Relaxed)
}

/// The render through the server; None when there is none (the caller forks directly).
pub fn render(budget: &RenderBudget, job: impl FnOnce() -> Vec<u8>) -> Option<Rendered> {
    let server = SERVER.get().filter(|s| s.alive.load(Ordering::Relaxed))?;
    let control = server.control.as_ref()?;
    let (ours, theirs) = UnixStream::pair().ok()?;
    let header = [
        budget.max_memory as u64,
        budget.time_limit.as_secs().saturating_add(1),
    ];
    if !send_fd(control.as_raw_fd(), &header, theirs.as_raw_fd()) {
        server.alive.store(false, Ordering::Relaxed);
        return None;
    }
    drop(theirs);
    let _ = ours.set_write_timeout(Some(budget.time_limit));
    let job = job();
    let mut w = &ours;
    if w.write_all(&(job.len() as u64).to_le_bytes()).is_err() || w.write_all(&job).is_err() {
        return Some(Rendered::Over(Overrun::Time(budget.time_limit)));
    }
    Some(collect(OwnedFd::from(ours), budget, || {}).rendered(budget, None))
}

/// One message of `header` carrying `fd`.
fn send_fd(control: RawFd, header: &[u64; 2], fd: RawFd) -> bool {
    let mut iov = libc::iovec {
        iov_base: header.as_ptr().cast_mut().cast(),
        iov_len: std::mem::size_of_val(header),
    };
    let mut space = [0u8; 64];
    // SAFETY: a msghdr over our iovec and a control buffer large enough for one fd (checked by
    // CMSG_SPACE against its length); the kernel copies the fd.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        let need = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
        if need > space.len() {
            return false;
        }
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = need;
        let c = libc::CMSG_FIRSTHDR(&raw const msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        libc::sendmsg(control, &raw const msg, libc::MSG_NOSIGNAL) > 0
    }
}

/// One message: its header and the fd it carries; None when the app has gone.
fn recv_fd(control: RawFd) -> Option<([u64; 2], RawFd)> {
    let mut header = [0u64; 2];
    let mut iov = libc::iovec {
        iov_base: header.as_mut_ptr().cast(),
        iov_len: std::mem::size_of_val(&header),
    };
    let mut space = [0u8; 64];
    // SAFETY: as in send_fd; a received fd is checked before use.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = space.len();
        let n = libc::recvmsg(control, &raw mut msg, libc::MSG_CMSG_CLOEXEC);
        if n <= 0 {
            return None;
        }
        let c = libc::CMSG_FIRSTHDR(&raw const msg);
        if c.is_null() || (*c).cmsg_type != libc::SCM_RIGHTS {
            return Some((header, -1));
        }
        Some((
            header,
            std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>()),
        ))
    }
}

/// The server's loop: a limited child per message, until the app closes its end.
fn serve(control: RawFd, runner: Runner) -> ! {
    keep_only(control);
    // SAFETY: children are reaped by the kernel (their answers go to the app, not to us).
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
    while let Some((header, fd)) = recv_fd(3) {
        if fd < 0 {
            continue;
        }
        // SAFETY: this process has one thread; the child leaves with _exit.
        if unsafe { libc::fork() } == 0 {
            // SAFETY: the control socket is not the child's to keep.
            unsafe { libc::close(3) };
            keep_only(fd);
            job(header, runner);
        }
        // SAFETY: the child has its copy; this one is done.
        unsafe { libc::close(fd) };
    }
    // SAFETY: the app is gone; leave without its exit handlers.
    unsafe { libc::_exit(0) }
}

/// A render child: limits, the job from fd 3, the answer to fd 3.
fn job([max_memory, cpu_secs]: [u64; 2], runner: Runner) -> ! {
    limit_memory(address_space().map(|n| n.saturating_add(max_memory)));
    let cpu = libc::rlimit {
        rlim_cur: cpu_secs,
        rlim_max: cpu_secs.saturating_add(1),
    };
    // SAFETY: a valid rlimit for this process.
    unsafe { libc::setrlimit(libc::RLIMIT_CPU, &raw const cpu) };
    // SAFETY: fd 3 is the job's socket, this process's own from here on.
    let mut sock = unsafe { UnixStream::from_raw_fd(3) };
    let bytes = read_job(&mut sock);
    // The answer goes to fd 3, which `sock` still holds open.
    std::mem::forget(sock);
    answer(|| match bytes {
        Some(b) => runner(&b),
        None => Rendered::Failed("the render job was cut short".into()),
    })
}

/// The job's bytes: an 8-byte length, then that many bytes.
fn read_job(sock: &mut UnixStream) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut len = [0u8; 8];
    sock.read_exact(&mut len).ok()?;
    let len = usize::try_from(u64::from_le_bytes(len)).ok()?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(len).ok()?;
    buf.resize(len, 0);
    sock.read_exact(&mut buf).ok()?;
    Some(buf)
}
