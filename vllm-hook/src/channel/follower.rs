//! A hook process without the listener (a vLLM worker running the logits processor)
//! follows the listening process: it fetches new directives and hands over its counters
//! every few milliseconds, so "end thinking now" reaches the process that samples.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use meridian_core::channel::{PROTOCOL_HEADER, PROTOCOL_VERSION, SYNC_PATH, SyncReply, SyncRequest};

use super::{Shared, affinity};
use crate::metrics::Counter;

/// How often a follower syncs while the listener answers, and after a failure.
const INTERVAL: Duration = Duration::from_millis(10);
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
            if let Some((to, from)) = affinity::move_off_inherited_cores() {
                eprintln!(
                    "meridian-hook: the policy-channel follower runs on CPUs {to:?}, off this worker's {from:?}"
                );
            }
            let agent: ureq::Agent =
                ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(2))).build().into();
            let url = format!("http://{connect}{SYNC_PATH}");
            let auth = format!("Bearer {secret}");
            let version = PROTOCOL_VERSION.to_string();
            let mut failing = false;
            while !flag.load(Ordering::Relaxed) {
                let after = shared.directives.lock().map(|t| t.seq()).unwrap_or(0);
                let body =
                    SyncRequest { after, worker: worker.clone(), counters: shared.counters.snapshot() };
                let reply = agent
                    .post(&url)
                    .header("Authorization", &auth)
                    .header(PROTOCOL_HEADER, &version)
                    .send_json(&body)
                    .and_then(|mut r| r.body_mut().read_json::<SyncReply>());
                match reply {
                    Ok(reply) => {
                        if let Ok(mut table) = shared.directives.lock() {
                            table.merge(reply);
                        }
                        failing = false;
                        std::thread::sleep(INTERVAL);
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
