//! [`Meter`]: the one place a Hub operation waits on the network. Every await goes through
//! [`Meter::wait`], which gives up after a time limit, stops within ~0.1 s of a cancel, and
//! reports [`PullProgress`] (bytes, speed over the last 3 s, ETA) about every 0.1 s meanwhile.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::config::{PullProgress, TICK};
use super::error::HubError;

/// Speed is averaged over this window.
const SPEED_WINDOW: Duration = Duration::from_secs(3);

/// Progress, cancel and time limits of one operation (a pull, or a listing on its own).
pub(super) struct Meter<'a> {
    pub report: PullProgress,
    /// (time, bytes transferred by this pull so far), for the speed.
    samples: VecDeque<(Instant, u64)>,
    /// Bytes of the files before the current one, and of what they resumed from.
    done_before: u64,
    resumed_before: u64,
    /// Bytes of the current file in hand, and how many of those it resumed from.
    file_done: u64,
    file_resumed: u64,
    /// Bytes transferred and then thrown away (a file restarted from 0): they count for speed.
    discarded: u64,
    last_report: Instant,
    cancel: &'a AtomicBool,
    on_progress: &'a mut dyn FnMut(&PullProgress),
}

impl<'a> Meter<'a> {
    pub fn new(cancel: &'a AtomicBool, on_progress: &'a mut dyn FnMut(&PullProgress)) -> Self {
        Self {
            report: PullProgress::default(),
            samples: VecDeque::new(),
            done_before: 0,
            resumed_before: 0,
            file_done: 0,
            file_resumed: 0,
            discarded: 0,
            last_report: Instant::now(),
            cancel,
            on_progress,
        }
    }

    /// Awaits `fut` for at most `limit`: `Ok(None)` when it took longer, [`HubError::Cancelled`]
    /// within one tick of the cancel flag being set. Reports progress every tick meanwhile.
    pub async fn wait<T>(
        &mut self,
        fut: impl Future<Output = T>,
        limit: Duration,
    ) -> Result<Option<T>, HubError> {
        let deadline = Instant::now() + limit;
        let mut fut = std::pin::pin!(fut);
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(HubError::Cancelled);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            if let Ok(out) = tokio::time::timeout(left.min(TICK), &mut fut).await {
                return Ok(Some(out));
            }
            self.tick();
        }
    }

    /// Errors with [`HubError::Cancelled`] when the cancel flag is set.
    pub fn check_cancel(&self) -> Result<(), HubError> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(HubError::Cancelled);
        }
        Ok(())
    }

    /// A new file starts, with `resumed` of its bytes already on disk.
    pub fn start_file(&mut self, resumed: u64) {
        self.file_done = resumed;
        self.file_resumed = resumed;
        self.tick();
    }

    /// The current file starts over from byte 0 (a server that ignored the `Range` asked for).
    pub fn restart_file(&mut self) {
        self.discarded += self.file_done.saturating_sub(self.file_resumed);
        self.file_done = 0;
        self.file_resumed = 0;
    }

    /// `n` more bytes of the current file arrived; reports at most once a tick.
    pub fn add(&mut self, n: u64) {
        self.file_done += n;
        if self.last_report.elapsed() >= TICK {
            self.tick();
        }
    }

    /// The current file is whole: its bytes count as done from now on.
    pub fn finish_file(&mut self, size: u64) {
        self.file_done = size;
        self.tick();
        self.done_before += size;
        self.resumed_before += self.file_resumed;
        self.file_done = 0;
        self.file_resumed = 0;
    }

    /// Reports progress now.
    pub fn tick(&mut self) {
        let now = Instant::now();
        self.last_report = now;
        self.report.done = self.done_before + self.file_done;
        let resumed = self.resumed_before + self.file_resumed;
        let transferred = self.report.done.saturating_sub(resumed) + self.discarded;
        self.samples.push_back((now, transferred));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > SPEED_WINDOW)
        {
            self.samples.pop_front();
        }
        if let (Some((t0, b0)), Some((t1, b1))) = (self.samples.front(), self.samples.back()) {
            let dt = t1.duration_since(*t0).as_secs_f64();
            if dt > 0.2 {
                self.report.bytes_per_s = b1.saturating_sub(*b0) as f64 / dt;
            }
        }
        let left = self.report.total.saturating_sub(self.report.done);
        self.report.eta = (self.report.bytes_per_s > 0.0)
            .then(|| Duration::from_secs_f64(left as f64 / self.report.bytes_per_s));
        (self.on_progress)(&self.report);
    }

    pub fn stage(&mut self, stage: &'static str) {
        self.report.stage = stage;
        (self.on_progress)(&self.report);
    }
}

/// A byte count as people read it ("1.5 MiB").
pub fn human_bytes(n: u64) -> String {
    let n = n as f64;
    match n {
        _ if n >= (1u64 << 30) as f64 => format!("{:.2} GiB", n / (1u64 << 30) as f64),
        _ if n >= (1u64 << 20) as f64 => format!("{:.1} MiB", n / (1u64 << 20) as f64),
        _ if n >= 1024.0 => format!("{:.1} KiB", n / 1024.0),
        _ => format!("{n} B"),
    }
}
