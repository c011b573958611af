//! The poller: one source polled on a thread of its own at a fixed cadence, so a slow or
//! hung driver call never freezes a reader. The live view and `serve` both read from it.

use std::sync::mpsc as std_mpsc;
use std::thread;
use std::time::Duration;

use tokio::sync::watch;

use crate::{SystemSnapshot, TelemetryError, TelemetrySource};

/// Polls a source on a dedicated thread at a fixed cadence and publishes only the latest
/// snapshot: if the UI is busy, older snapshots are replaced, never queued.
/// Dropping the poller stops the thread at its next wake-up.
pub struct Poller {
    pub snapshots: watch::Receiver<Option<SystemSnapshot>>,
    _stop: std_mpsc::Sender<()>,
}

impl Poller {
    pub fn spawn(
        mut source: Box<dyn TelemetrySource>,
        interval: Duration,
    ) -> Result<Self, TelemetryError> {
        let (tx, rx) = watch::channel(None);
        let (stop_tx, stop_rx) = std_mpsc::channel::<()>();
        thread::Builder::new()
            .name("vramtop-telemetry".into())
            .spawn(move || {
                let mut next = std::time::Instant::now();
                loop {
                    tx.send_replace(Some(source.poll()));
                    next += interval;
                    // After a slow poll, start a fresh cadence rather than polling back
                    // to back to catch up on ticks nobody will see.
                    let now = std::time::Instant::now();
                    if next < now {
                        next = now + interval;
                    }
                    let wait = next.saturating_duration_since(std::time::Instant::now());
                    // The stop channel doubles as an interruptible sleep.
                    match stop_rx.recv_timeout(wait) {
                        Err(std_mpsc::RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                    if tx.is_closed() {
                        return;
                    }
                }
            })
            .map_err(|source| TelemetryError::Thread {
                what: "telemetry",
                source,
            })?;
        Ok(Poller {
            snapshots: rx,
            _stop: stop_tx,
        })
    }
}
