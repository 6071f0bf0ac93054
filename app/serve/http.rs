//! The HTTP/1.1 connection layer under the axum router (hyper's connection builder, which
//! `axum::serve` hides): who gets a connection slot, and per connection a first-byte deadline,
//! a header timeout, an idle keep-alive timeout, and a cut-off for a client that stops reading.
//!
//! Slots. At most `max_connections` are served at once. While a slot is free anyone takes it;
//! once every slot is taken, a newcomer evicts the connection that has sat idle longest (no
//! request in flight, no request head begun) of the address holding the most, or, none idle,
//! cuts the oldest unfinished request head of an address holding more than
//! `max_connections_per_address`; a newcomer whose own address holds that many evicts that
//! address's idlest connection, or gets a 503 at once when all of them are busy. Otherwise it
//! waits for a slot (up to the header timeout, then a 503). So idle or silent connections,
//! however many, never keep another client out, and one address dribbling its headers can keep
//! others out of at most its excess over its share; a request in flight is never cut.
//!
//! hyper's own `header_read_timeout` starts when hyper waits for a request head, which on a
//! kept-alive connection is also the idle time between requests: it would close every idle
//! connection after the header timeout. So one watchdog per connection tells the states apart
//! from what its socket and its requests do: a new connection must send its first byte within
//! the first-byte timeout; bytes arriving with no request in flight start the header clock; a
//! request's head reaching the router stops it; the last response ending starts the idle
//! clock. The body timeout is the handlers' (they read the body themselves).

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::limits::Limits;
use super::state::Peer;

/// How long a new connection that has sent nothing yet is safe from eviction: a real client
/// sends its request at once.
const FRESH: Duration = Duration::from_millis(500);

/// What the watchdog reads: when each clock started, in ms since `origin` plus one (0 = stopped).
struct ConnClock {
    origin: Instant,
    /// Any byte received yet.
    heard: AtomicBool,
    in_flight: AtomicUsize,
    /// First byte of a request head that has not reached the router yet.
    head_since: AtomicU64,
    /// The last response ended (or the connection opened) with nothing in flight.
    idle_since: AtomicU64,
    /// A write has been waiting on the client since.
    blocked_since: AtomicU64,
    /// Chosen to make room for a newcomer (so no other newcomer counts on it too).
    kicked: AtomicBool,
    /// Cut for a newcomer while its request head is unfinished (see `Table::make_room`).
    cut: AtomicBool,
}

impl ConnClock {
    fn new() -> Arc<Self> {
        let c = Self {
            origin: Instant::now(),
            heard: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            head_since: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            blocked_since: AtomicU64::new(0),
            kicked: AtomicBool::new(false),
            cut: AtomicBool::new(false),
        };
        c.idle_since.store(c.now(), Ordering::Relaxed);
        Arc::new(c)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    fn bytes_in(&self) {
        self.heard.store(true, Ordering::Release);
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
        let silent =
            !self.heard.load(Ordering::Acquire) && self.origin.elapsed() > l.first_byte_timeout;
        if silent
            || over(&self.head_since, l.header_timeout)
            || over(&self.blocked_since, l.idle_timeout)
        {
            return Verdict::Cut;
        }
        let idle = self.in_flight.load(Ordering::Acquire) == 0
            && self.elapsed(&self.head_since).is_none()
            && over(&self.idle_since, l.idle_timeout);
        if idle { Verdict::Idle } else { Verdict::Fine }
    }

    /// When its unfinished request head began (ms on this clock), if one is.
    fn head_started(&self) -> Option<u64> {
        if self.in_flight.load(Ordering::Acquire) != 0 {
            return None;
        }
        match self.head_since.load(Ordering::Acquire) {
            0 => None,
            t => Some(t),
        }
    }

    /// Idle since when (ms on this clock), if it could be closed now without cutting a request
    /// or a request head short.
    fn evictable_since(&self) -> Option<u64> {
        if self.in_flight.load(Ordering::Acquire) != 0 || self.elapsed(&self.head_since).is_some() {
            return None;
        }
        // A client that has just connected is about to send its request.
        if !self.heard.load(Ordering::Acquire) && self.origin.elapsed() < FRESH {
            return None;
        }
        match self.idle_since.load(Ordering::Acquire) {
            0 => None,
            t => Some(t),
        }
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

/// One live connection, as the slot keeper sees it.
struct Entry {
    id: u64,
    ip: IpAddr,
    clock: Arc<ConnClock>,
    kick: Arc<Notify>,
}

impl Entry {
    /// Tells the connection to make room (closing now if it is still idle, or, when `cut`,
    /// still short of a whole request head).
    fn kick(&self) {
        self.clock.kicked.store(true, Ordering::Release);
        self.kick.notify_one();
    }
}

/// The live connections (a few hundred at most: scanned on each arrival).
#[derive(Default)]
struct Table {
    next_id: AtomicU64,
    live: Mutex<Vec<Entry>>,
}

/// Whom a new connection may push out.
enum Room {
    /// A slot is (or will soon be) free.
    Wait,
    /// Its address is at its cap and every one of its connections is busy.
    Refuse,
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes room for a connection from `ip` when every slot is taken (with a slot free,
    /// nobody is pushed out, whatever the address holds). Past its own address's cap: that
    /// address's idlest connection is closed, or, all of them busy, the newcomer is refused.
    /// Otherwise: the idlest connection of the address holding the most is closed; with none
    /// idle, the oldest unfinished request head of an address past its cap is cut (a request
    /// already in flight never is); with none of those either, the newcomer waits.
    fn make_room(&self, ip: IpAddr, l: &Limits) -> Room {
        let live = self.lock();
        if live.len() < l.max_connections {
            return Room::Wait;
        }
        let count = |ip: IpAddr| live.iter().filter(|e| e.ip == ip).count();
        let over = |ip: IpAddr| count(ip) >= l.max_connections_per_address;
        let idlest = |only: Option<IpAddr>| {
            live.iter()
                .filter(|e| only.is_none_or(|ip| e.ip == ip))
                .filter(|e| !e.clock.kicked.load(Ordering::Acquire))
                .filter_map(|e| e.clock.evictable_since().map(|t| (count(e.ip), t, e)))
                // Most connections first, then the longest idle (the smallest start).
                .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
                .map(|(_, _, e)| e)
        };
        if over(ip) {
            return match idlest(Some(ip)) {
                Some(e) => {
                    e.kick();
                    Room::Wait
                }
                None => Room::Refuse,
            };
        }
        if let Some(e) = idlest(None) {
            e.kick();
            return Room::Wait;
        }
        let slowest = live
            .iter()
            .filter(|e| over(e.ip) && !e.clock.kicked.load(Ordering::Acquire))
            .filter_map(|e| e.clock.head_started().map(|t| (t, e)))
            .min_by_key(|(t, _)| *t);
        if let Some((_, e)) = slowest {
            e.clock.cut.store(true, Ordering::Release);
            e.kick();
        }
        Room::Wait
    }

    fn join(self: &Arc<Self>, ip: IpAddr, clock: Arc<ConnClock>) -> (Arc<Notify>, Member) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let kick = Arc::new(Notify::new());
        self.lock().push(Entry {
            id,
            ip,
            clock,
            kick: Arc::clone(&kick),
        });
        (kick, Member(Arc::clone(self), id))
    }
}

/// A connection's place in the table, left when it ends.
struct Member(Arc<Table>, u64);

impl Drop for Member {
    fn drop(&mut self) {
        self.0.lock().retain(|e| e.id != self.1);
    }
}

/// Serves `app` on `listener` until the future is dropped, under the slot rules above.
/// Connections waiting for a slot are bounded too (as many as the slots): past that the accept
/// waits, and newer ones queue in the kernel's backlog.
pub async fn serve(listener: TcpListener, app: Router, limits: Limits) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let waiting = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let table = Arc::new(Table::default());
    let limits = Arc::new(limits);
    loop {
        let Ok(pending) = Arc::clone(&waiting).acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            // Out of file descriptors and the like: breathe, then go on serving.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let admit = Admit {
            slots: Arc::clone(&slots),
            table: Arc::clone(&table),
            limits: Arc::clone(&limits),
        };
        tokio::spawn(admit.run(stream, peer.ip(), app.clone(), pending));
    }
}

struct Admit {
    slots: Arc<Semaphore>,
    table: Arc<Table>,
    limits: Arc<Limits>,
}

impl Admit {
    async fn run(self, stream: TcpStream, ip: IpAddr, app: Router, pending: OwnedSemaphorePermit) {
        let l = &self.limits;
        let slot = match self.table.make_room(ip, l) {
            Room::Refuse => None,
            Room::Wait => {
                tokio::time::timeout(l.header_timeout, Arc::clone(&self.slots).acquire_owned())
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
        };
        drop(pending);
        match slot {
            Some(slot) => connection(stream, ip, app, self, slot).await,
            None => busy(stream).await,
        }
    }
}

/// A 503 written straight to a connection that gets no slot, then a short drain so the close
/// does not reset the answer away.
async fn busy(mut stream: TcpStream) {
    let body = r#"{"error":{"message":"the server has no free connection slot for this address; retry shortly","type":"server_error","param":null,"code":"too_many_connections"}}"#;
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut left = 64usize << 10;
        while left > 0 {
            let n = stream.read(&mut sink).await?;
            if n == 0 {
                break;
            }
            left = left.saturating_sub(n);
        }
        io::Result::Ok(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}

/// How often a connection's watchdog looks: a fraction of the shortest timeout.
fn tick(l: &Limits) -> Duration {
    (l.header_timeout
        .min(l.idle_timeout)
        .min(l.first_byte_timeout)
        / 8)
    .clamp(Duration::from_millis(20), Duration::from_secs(1))
}

async fn connection(
    stream: TcpStream,
    ip: IpAddr,
    app: Router,
    admit: Admit,
    _slot: OwnedSemaphorePermit,
) {
    let limits = admit.limits;
    let clock = ConnClock::new();
    let (kick, _member) = admit.table.join(ip, Arc::clone(&clock));
    let io = TokioIo::new(Watched {
        inner: stream,
        clock: Arc::clone(&clock),
    });
    let router = TowerToHyperService::new(app);
    let svc_clock = Arc::clone(&clock);
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        let in_flight = svc_clock.request_started();
        req.extensions_mut().insert(Peer(ip));
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
            () = kick.notified() => {
                // Evicted for a newcomer: only ever while idle, or (`cut`) while a request head
                // is unfinished; a request that raced in since is let finish.
                let head_only = clock.cut.load(Ordering::Acquire)
                    && clock.in_flight.load(Ordering::Acquire) == 0;
                if head_only || clock.evictable_since().is_some() {
                    return;
                }
                if !closing {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
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
