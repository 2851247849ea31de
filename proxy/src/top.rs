//! `meridian top`: the open streams of a running proxy, live, from its admin listener
//! (`[admin]`), for an operator at a terminal: which requests are queued, thinking or
//! answering, for how long, with how many tokens, and how their thinking will end.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use clap::Args;

use crate::streams::{Ending, Stage, StreamList, StreamView};

#[derive(Args, Debug, Clone)]
pub struct TopArgs {
    /// Base URL of the proxy's admin listener (admin.listen).
    #[arg(long, env = "MERIDIAN_ADMIN_URL", default_value = "http://127.0.0.1:9091")]
    pub admin: String,
    /// Environment variable holding the admin token (admin.token_env).
    #[arg(long, default_value = "MERIDIAN_ADMIN_TOKEN")]
    pub token_env: String,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Print the streams once and exit (for scripts and logs).
    #[arg(long)]
    pub once: bool,
    /// Rows shown, oldest streams first.
    #[arg(long, default_value_t = 40)]
    pub rows: usize,
}

/// Why `meridian top` stopped.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error("environment variable {0} (the admin token) is unset or empty")]
    NoToken(String),
    #[error("--interval must be a positive number of seconds; got {0}")]
    Interval(f64),
    #[error("cannot reach the admin listener at {url}: {source}")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the admin listener at {url} answered {status}: {body}")]
    Refused { url: String, status: u16, body: String },
}

/// Polls the admin listener and draws the table until interrupted (or once).
pub async fn run(args: TopArgs) -> Result<(), TopError> {
    let token = match std::env::var(&args.token_env) {
        Ok(t) if !t.trim().is_empty() => t.trim().to_owned(),
        _ => return Err(TopError::NoToken(args.token_env)),
    };
    if !(args.interval.is_finite() && args.interval > 0.0) {
        return Err(TopError::Interval(args.interval));
    }
    let url = format!("{}{}", args.admin.trim_end_matches('/'), crate::streams::admin::STREAMS_PATH);
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|source| TopError::Unreachable { url: url.clone(), source })?;
    let live = std::io::stdout().is_terminal() && !args.once;
    loop {
        let list = fetch(&client, &url, &token).await?;
        let mut out = std::io::stdout().lock();
        // On a terminal each frame replaces the last; elsewhere frames follow each other.
        let clear = if live { "\x1b[H\x1b[2J" } else { "" };
        let _ = write!(out, "{clear}{}", render(&list, args.rows));
        let _ = out.flush();
        if args.once {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs_f64(args.interval)).await;
    }
}

async fn fetch(client: &reqwest::Client, url: &str, token: &str) -> Result<StreamList, TopError> {
    let unreachable = |source| TopError::Unreachable { url: url.to_owned(), source };
    let resp = client.get(url).bearer_auth(token).send().await.map_err(unreachable)?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp.text().await.unwrap_or_default();
        return Err(TopError::Refused { url: url.to_owned(), status: status.as_u16(), body });
    }
    resp.json::<StreamList>().await.map_err(unreachable)
}

/// One frame: a summary line, then a row per stream (oldest first, at most `rows`).
pub fn render(list: &StreamList, rows: usize) -> String {
    let by = &list.streams_by_phase;
    let queued = list.streams.iter().filter(|s| s.stage == Stage::Queued).count();
    let mut out = format!(
        "meridian top: {} open; relaying {} thinking, {} answering, {} before their first token; {} queued\n\n",
        list.open, by.think, by.output, by.pending, queued
    );
    let header =
        ["STREAM", "MODEL", "UPSTREAM", "STAGE", "PHASE", "AGE", "THINK", "ANSWER", "CLASS", "BUDGET"];
    let [id, model, upstream, stage, phase, age, think, answer, class, budget] = header;
    let _ = writeln!(
        out,
        "{id:<28} {model:<20} {upstream:<12} {stage:<9} {phase:<7} {age:>8} {think:>6} {answer:>6} {class:<11} {budget:>6} ENDING"
    );
    for s in list.streams.iter().take(rows) {
        let _ = writeln!(out, "{}", row(s));
    }
    if list.streams.len() > rows {
        let _ = writeln!(out, "… {} more", list.streams.len() - rows);
    }
    out
}

fn row(s: &StreamView) -> String {
    format!(
        "{:<28} {:<20} {:<12} {:<9} {:<7} {:>7.1}s {:>6} {:>6} {:<11} {:>6} {}",
        clip(&s.stream_id, 28),
        clip(&s.model, 20),
        clip(s.upstream.as_deref().unwrap_or("-"), 12),
        match s.stage {
            Stage::Queued => "queued",
            Stage::AwaitingUpstream => "upstream",
            Stage::Relaying => "relaying",
        },
        s.phase,
        s.age_s,
        s.think_tokens,
        s.output_tokens,
        s.class,
        s.think_budget.map_or_else(|| "-".to_owned(), |b| b.to_string()),
        match s.ending {
            Ending::None => "-",
            Ending::Hook => "hook",
            Ending::Continuation => "continuation",
            Ending::HookDirectiveSent => "hook: ended",
            Ending::Continued => "continued",
        }
    )
}

/// At most `n` characters, the end kept (ids differ at their end).
fn clip(s: &str, n: usize) -> String {
    let count = s.chars().count();
    if count <= n {
        return s.to_owned();
    }
    let tail: String = s.chars().skip(count - (n - 1)).collect();
    format!("…{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::streams::admin::PhaseCounts;

    fn view(id: &str, stage: Stage, phase: &str, ending: Ending) -> StreamView {
        StreamView {
            stream_id: id.into(),
            request_id: "r".into(),
            model: "Qwen/Qwen3-8B".into(),
            route: "chat_completions".into(),
            upstream: (stage != Stage::Queued).then(|| "vllm-0".into()),
            stage,
            phase: phase.into(),
            age_s: 12.25,
            started_unix_ms: 0,
            think_tokens: 310,
            output_tokens: 4,
            class: "interactive".into(),
            streaming: true,
            think_budget: Some(1024),
            ending,
        }
    }

    #[test]
    fn a_frame_sums_up_then_lists_each_stream() {
        let list = StreamList {
            open: 3,
            streams_by_phase: PhaseCounts { pending: 0, think: 1, output: 1 },
            streams: vec![
                view("mrd_abc_1", Stage::Relaying, "think", Ending::HookDirectiveSent),
                view("mrd_abc_2", Stage::Relaying, "output", Ending::None),
                view("mrd_abc_3", Stage::Queued, "pending", Ending::Continuation),
            ],
        };
        let frame = render(&list, 2);
        let lines: Vec<&str> = frame.lines().collect();
        assert!(
            lines[0]
                .contains("3 open; relaying 1 thinking, 1 answering, 0 before their first token; 1 queued")
        );
        assert!(lines[2].starts_with("STREAM"));
        assert!(
            lines[3].starts_with("mrd_abc_1")
                && lines[3].contains("think")
                && lines[3].contains("hook: ended")
        );
        assert!(lines[3].contains("12.2s") && lines[3].contains(" 310 ") && lines[3].contains(" 1024 "));
        assert!(lines[4].starts_with("mrd_abc_2") && lines[4].contains("output"));
        assert_eq!(lines[5], "… 1 more");
    }

    #[test]
    fn long_names_keep_their_distinguishing_end() {
        assert_eq!(clip("mrd_0123456789ab_123456", 10), "…ab_123456");
        assert_eq!(clip("short", 10), "short");
    }
}
