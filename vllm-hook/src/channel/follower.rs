//! A hook process without the listener (a vLLM worker running the logits processor)
//! follows the listening process: it long-polls for new directives (the listener
//! answers the moment one arrives, or after `HOLD` with nothing) and hands over its
//! counters with each poll, so "end thinking now" reaches the process that samples at
//! once while an idle channel wakes the follower about once a second.
//!
//! Why not a short poll: vLLM's CPU build pins each worker's threads to its compute
//! cores, and the follower, started from the worker, inherits that pin. Polling every
//! 10 ms put a hundred HTTP round trips a second on the core that runs the forward
//! pass, and the hooked engine's steps were measurably slower for it (the hook cost
//! page's interleaved A/B).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use meridian_core::channel::{PROTOCOL_HEADER, PROTOCOL_VERSION, SYNC_PATH, SyncReply, SyncRequest};

use super::Shared;
use crate::metrics::Counter;

/// How long the listener may hold a sync that finds nothing new.
const HOLD: Duration = Duration::from_secs(1);
/// The least time between two syncs when a reply came back at once with nothing new (a
/// listener that does not hold, or one too busy to): keeps a poll from spinning.
const MIN_GAP: Duration = Duration::from_millis(50);
/// The wait after a failed sync.
const BACKOFF: Duration = Duration::from_millis(500);

pub struct Follower {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Follower {
    /// Starts following the listener at `connect` (`host:port`).
    pub fn start(
        connect: String,
        secret: String,
        worker: String,
        shared: Arc<Shared>,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new().name("meridian-follow".into()).spawn(move || {
            let agent: ureq::Agent =
                ureq::Agent::config_builder().timeout_global(Some(HOLD + Duration::from_secs(2))).build().into();
            let wait_ms = u64::try_from(HOLD.as_millis()).unwrap_or(u64::MAX);
            let url = format!("http://{connect}{SYNC_PATH}");
            let auth = format!("Bearer {secret}");
            let version = PROTOCOL_VERSION.to_string();
            let mut failing = false;
            while !flag.load(Ordering::Relaxed) {
                let after = shared.directives.lock().map(|t| t.seq()).unwrap_or(0);
                let body =
                    SyncRequest { after, worker: worker.clone(), counters: shared.counters.snapshot(), wait_ms };
                let asked = Instant::now();
                let reply = agent
                    .post(&url)
                    .header("Authorization", &auth)
                    .header(PROTOCOL_HEADER, &version)
                    .send_json(&body)
                    .and_then(|mut r| r.body_mut().read_json::<SyncReply>());
                match reply {
                    Ok(reply) => {
                        let news = reply.seq > after || reply.snapshot;
                        if let Ok(mut table) = shared.directives.lock() {
                            table.merge(reply);
                        }
                        failing = false;
                        let took = asked.elapsed();
                        if !news && took < MIN_GAP {
                            std::thread::sleep(MIN_GAP - took);
                        }
                    }
                    Err(e) => {
                        if !failing {
                            eprintln!(
                                "meridian-hook: cannot sync with the policy channel at {url}: {e}; retrying"
                            );
                        }
                        failing = true;
                        shared.counters.add(Counter::ErrorSync, 1);
                        std::thread::sleep(BACKOFF);
                    }
                }
            }
        })?;
        Ok(Follower { stop, thread: Some(thread) })
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
