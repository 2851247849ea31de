//! Runs a plan against a target: open-loop sends at the scheduled offsets, a concurrency
//! cap, an optional duration limit, and a live progress bar.

use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::{Mutex, Semaphore};

use crate::client::Target;
use crate::dataset::Prompt;
use crate::record::RequestRecord;

pub struct Plan {
    pub prompts: Vec<Prompt>,
    /// Send offsets in seconds, one per prompt.
    pub offsets: Vec<f64>,
    pub max_concurrency: Option<usize>,
    /// Stop sending new requests after this many seconds.
    pub duration_s: Option<f64>,
    pub progress: bool,
    pub label: String,
}

/// What a run produced.
pub struct RunOutput {
    pub records: Vec<RequestRecord>,
    pub duration_s: f64,
    /// CPU seconds this process used during the run (the tester's own cost).
    pub client_cpu_s: f64,
}

pub async fn run(target: &Target, plan: &Plan) -> RunOutput {
    let n = plan.prompts.len();
    let bar = if plan.progress { ProgressBar::new(n as u64) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(plan.label.clone());
    let limit = Arc::new(Semaphore::new(plan.max_concurrency.unwrap_or(Semaphore::MAX_PERMITS).max(1)));
    let records = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let tokens = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let cpu_before = process_cpu_seconds();
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for (i, (prompt, offset)) in plan.prompts.iter().zip(&plan.offsets).enumerate() {
        if plan.duration_s.is_some_and(|d| *offset > d) {
            break;
        }
        tokio::time::sleep_until(tokio::time::Instant::from_std(start + Duration::from_secs_f64(*offset)))
            .await;
        let permit = limit.clone().acquire_owned().await;
        let (target, prompt, records, bar, tokens) =
            (target.clone(), prompt.clone(), records.clone(), bar.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let sent_at = start.elapsed().as_secs_f64();
            let record = target.send(i, sent_at, &prompt).await;
            drop(permit);
            let total = tokens
                .fetch_add(u64::from(record.completion_tokens()), std::sync::atomic::Ordering::Relaxed)
                + u64::from(record.completion_tokens());
            let secs = start.elapsed().as_secs_f64().max(1e-9);
            bar.inc(1);
            bar.set_message(format!(
                "{:.1} req/s, {:.0} tok/s",
                bar.position() as f64 / secs,
                total as f64 / secs
            ));
            records.lock().await.push(record);
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let duration_s = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let mut records = std::mem::take(&mut *records.lock().await);
    records.sort_by_key(|r| r.index);
    RunOutput { records, duration_s, client_cpu_s: process_cpu_seconds() - cpu_before }
}

/// User + system CPU seconds of this process (Linux /proc; 0 elsewhere).
pub fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}
