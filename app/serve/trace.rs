//! `tpslab serve --record-trace FILE`: one JSON line per finished request (its arrival time and
//! its prompt and completion tokens, the tuner's [`TraceEntry`]), appended by a writer thread so
//! that a request never waits on the disk. Bounded: at most [`MAX_TRACE_LINES`] lines per run
//! (recording then stops), and entries that find the writer's queue full are dropped and
//! counted, never held.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender};

use tpslab_engine::tune::TraceEntry;
use tpslab_engine::tune::workload::MAX_TRACE_LINES;

/// Entries waiting for the writer at most.
const QUEUE: usize = 4096;

pub struct TraceWriter {
    tx: SyncSender<TraceEntry>,
    dropped: AtomicU64,
}

impl TraceWriter {
    /// Appends to `path` (created if missing).
    pub fn open(path: &Path) -> Result<Self, String> {
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("cannot record a trace to {}: {e}", path.display()))?;
        let (tx, rx) = mpsc::sync_channel::<TraceEntry>(QUEUE);
        let shown = path.display().to_string();
        std::thread::Builder::new()
            .name("tpslab-trace".into())
            .spawn(move || {
                for (n, e) in rx.into_iter().enumerate() {
                    if n == MAX_TRACE_LINES {
                        eprintln!("trace {shown}: {MAX_TRACE_LINES} requests recorded; no more");
                        break;
                    }
                    let line = serde_json::to_string(&e).unwrap_or_default();
                    if let Err(err) = writeln!(file, "{line}") {
                        eprintln!("trace {shown}: {err}; recording stops");
                        break;
                    }
                }
            })
            .map_err(|e| format!("cannot start the trace writer: {e}"))?;
        Ok(Self {
            tx,
            dropped: AtomicU64::new(0),
        })
    }

    /// Queues one entry; a full queue (or a writer that stopped) drops it, and the first drop
    /// is said on stderr.
    pub fn record(&self, e: TraceEntry) {
        if self.tx.try_send(e).is_err() && self.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
            eprintln!("trace: the writer is behind or stopped; entries are dropped");
        }
    }
}
