//! Graceful drain. On SIGTERM the server stops taking requests and readiness fails at
//! once; streams already open get `server.shutdown_grace_s` to finish. When the grace
//! runs out, every response still open ends with a `server_shutting_down` error event
//! (a client sees why its answer stopped and can retry, instead of a cut connection),
//! and then the process exits.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

#[derive(Default)]
pub struct Drain {
    draining: AtomicBool,
    grace_over: CancellationToken,
}

impl Drain {
    /// The server stops taking requests: readiness fails from now on.
    pub fn begin(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// The grace is over: whatever is still open ends now.
    pub fn end_grace(&self) {
        self.begin();
        self.grace_over.cancel();
    }

    /// Resolves when the grace is over (at once if it already is).
    pub fn grace_over(&self) -> WaitForCancellationFutureOwned {
        self.grace_over.clone().cancelled_owned()
    }
}
