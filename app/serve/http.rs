//! The HTTP/1.1 connection layer under the axum router (hyper's connection builder, which
//! `axum::serve` hides): a cap on connections served at once, and per connection a header
//! timeout, an idle keep-alive timeout, and a cut-off for a client that stops reading.
//!
//! hyper's own `header_read_timeout` starts when hyper waits for a request head, which on a
//! kept-alive connection is also the idle time between requests: it would close every idle
//! connection after the header timeout. So one watchdog per connection tells the states apart
//! from what its socket and its requests do: bytes arriving with no request in flight start
//! the header clock; a request's head reaching the router stops it; the last response ending
//! starts the idle clock. The body timeout is the handlers' (they read the body themselves).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::Service;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::limits::Limits;

/// What the watchdog reads: when each clock started, in ms since `origin` plus one (0 = stopped).
struct ConnClock {
    origin: Instant,
    in_flight: AtomicUsize,
    /// First byte of a request head that has not reached the router yet.
    head_since: AtomicU64,
    /// The last response ended (or the connection opened) with nothing in flight.
    idle_since: AtomicU64,
    /// A write has been waiting on the client since.
    blocked_since: AtomicU64,
}

impl ConnClock {
    fn new() -> Arc<Self> {
        let c = Self {
            origin: Instant::now(),
            in_flight: AtomicUsize::new(0),
            head_since: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            blocked_since: AtomicU64::new(0),
        };
        c.idle_since.store(c.now(), Ordering::Relaxed);
        Arc::new(c)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    fn bytes_in(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0 {
            let _ = self.head_since.compare_exchange(
                0,
                self.now(),
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    fn request_started(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(0, Ordering::Release);
        InFlight(Arc::clone(self))
    }

    fn elapsed(&self, clock: &AtomicU64) -> Option<Duration> {
        match clock.load(Ordering::Acquire) {
            0 => None,
            t => Some(Duration::from_millis(self.now().saturating_sub(t))),
        }
    }

    fn verdict(&self, l: &Limits) -> Verdict {
        let over =
            |clock: &AtomicU64, limit: Duration| self.elapsed(clock).is_some_and(|e| e > limit);
        if over(&self.head_since, l.header_timeout) || over(&self.blocked_since, l.idle_timeout) {
            return Verdict::Cut;
        }
        let idle = self.in_flight.load(Ordering::Acquire) == 0
            && self.elapsed(&self.head_since).is_none()
            && over(&self.idle_since, l.idle_timeout);
        if idle { Verdict::Idle } else { Verdict::Fine }
    }
}

enum Verdict {
    Fine,
    /// Close when nothing is in flight (hyper's graceful shutdown).
    Idle,
    /// Drop the connection now: headers too slow, or a client that stopped reading.
    Cut,
}

/// One request from its head reaching the router to its response body being dropped.
struct InFlight(Arc<ConnClock>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let c = &self.0;
        if c.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            c.idle_since.store(c.now(), Ordering::Release);
        }
    }
}

/// A response body that keeps its request counted as in flight until hyper drops it.
struct Tracked {
    inner: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The socket, reporting reads and blocked writes to the clock.
struct Watched {
    inner: TcpStream,
    clock: Arc<ConnClock>,
}

impl Watched {
    fn wrote<T>(&self, r: &Poll<io::Result<T>>) {
        match r {
            Poll::Pending => {
                let now = self.clock.now();
                let _ = self.clock.blocked_since.compare_exchange(
                    0,
                    now,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
            }
            Poll::Ready(_) => self.clock.blocked_since.store(0, Ordering::Release),
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.clock.bytes_in();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, b);
        this.wrote(&r);
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.wrote(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Serves `app` on `listener` until the future is dropped: at most `max_connections` at once
/// (the accept waits for a free slot, so others queue in the kernel's backlog).
pub async fn serve(listener: TcpListener, app: Router, limits: Limits) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let limits = Arc::new(limits);
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            // Out of file descriptors and the like: breathe, then go on serving.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(connection(stream, app.clone(), Arc::clone(&limits), slot));
    }
}

/// How often a connection's watchdog looks: a fraction of the shortest timeout.
fn tick(l: &Limits) -> Duration {
    (l.header_timeout.min(l.idle_timeout) / 8)
        .clamp(Duration::from_millis(20), Duration::from_secs(1))
}

async fn connection(
    stream: TcpStream,
    app: Router,
    limits: Arc<Limits>,
    _slot: OwnedSemaphorePermit,
) {
    let clock = ConnClock::new();
    let io = TokioIo::new(Watched {
        inner: stream,
        clock: Arc::clone(&clock),
    });
    let router = TowerToHyperService::new(app);
    let svc_clock = Arc::clone(&clock);
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let in_flight = svc_clock.request_started();
        let answer = router.call(req);
        async move {
            let resp = answer.await?;
            Ok::<_, std::convert::Infallible>(resp.map(|inner| {
                Body::new(Tracked {
                    inner,
                    _in_flight: in_flight,
                })
            }))
        }
    });
    let conn = http1::Builder::new().serve_connection(io, svc);
    let mut conn = std::pin::pin!(conn);
    let mut ticks = tokio::time::interval(tick(&limits));
    let mut closing = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = ticks.tick() => match clock.verdict(&limits) {
                Verdict::Fine => {}
                Verdict::Idle if !closing => {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
                Verdict::Idle => {}
                Verdict::Cut => return,
            },
        }
    }
}

/// Runs `serve` until `stop` resolves.
pub async fn serve_until(listener: TcpListener, app: Router, limits: Limits, stop: impl Future) {
    tokio::select! {
        () = serve(listener, app, limits) => {}
        _ = stop => {}
    }
}
