//! The page: per routing policy, two and four replicas (not told how many they are, told,
//! and asking the engines for places) against one on the same requests, the prefix caches' hit rate, and each engine's peak
//! of requests held against its limit.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use meridian_loadtest::record::RequestRecord;

use crate::kept::{Sitting, condition_name};
use crate::stats::{Effect, Metric, TARGET_RATIO, effect, effect_of, verdict};
use crate::{ROUTINGS, Run, SETUPS, SYSTEM_TOKENS, Settings, Sharing};

/// A tail compared: a percentile over requests of one figure each, or over every gap
/// between answer tokens, pooled.
#[derive(Clone, Copy)]
enum Tail {
    Requests(Metric, f64),
    AnswerTokens(f64),
}

impl Tail {
    fn effect(self, pairs: &[(&[RequestRecord], &[RequestRecord])]) -> Effect {
        match self {
            Tail::Requests(m, p) => effect(pairs, m, p),
            Tail::AnswerTokens(p) => effect_of(pairs, |run, idx| pooled_output_itl(run, idx, p)),
        }
    }
}

/// Percentile `p` of every gap between answer tokens of the requests `idx` of a run, pooled
/// (the reader's inter-token latency, token by token, not request by request); a failed
/// request adds one gap slower than any.
fn pooled_output_itl(run: &[RequestRecord], idx: &[usize], p: f64) -> f64 {
    let mut gaps: Vec<f64> = Vec::new();
    for &i in idx {
        let r = &run[i];
        if r.ok {
            gaps.extend_from_slice(&r.output_itl);
        } else {
            gaps.push(f64::INFINITY);
        }
    }
    if gaps.is_empty() {
        return f64::NAN;
    }
    // Nearest rank, as `pct`, by selection: the bootstrap takes thousands of these over
    // tens of thousands of gaps.
    let rank = ((p / 100.0) * gaps.len() as f64).ceil().max(1.0) as usize;
    let k = rank.min(gaps.len()) - 1;
    *gaps.select_nth_unstable_by(k, f64::total_cmp).1
}

/// The tails compared, each lower is better. The answer's ITL is pooled over every gap
/// between answer tokens, as a reader meets them; a request's mean (time per output
/// token) and its longest gap are beside it.
const TAILS: [(&str, Tail); 5] = [
    ("TTFT p99", Tail::Requests(|r| r.ttft, 99.0)),
    ("TTOT p99", Tail::Requests(|r| r.think_to_output, 99.0)),
    ("answer ITL p99 (every gap between answer tokens)", Tail::AnswerTokens(99.0)),
    ("time per output token p99", Tail::Requests(|r| r.tpot, 99.0)),
    ("answer's largest gap p99", Tail::Requests(|r| r.max_output_gap, 99.0)),
];

/// One replica, the baseline.
pub(crate) const ALONE: (usize, Sharing) = (1, Sharing::Parts);

pub(crate) fn run_of<'a>(
    runs: &'a [Run],
    routing: &str,
    (replicas, sharing): (usize, Sharing),
) -> Option<&'a Run> {
    runs.iter().find(|r| r.routing == routing && r.replicas == replicas && r.sharing == sharing)
}

/// How the replicas' config shares the engines' limits, in a table cell.
pub(crate) fn configured((replicas, sharing): (usize, Sharing)) -> String {
    match sharing {
        Sharing::NotTold => "replicas = 1".into(),
        Sharing::Parts => format!("replicas = {replicas}"),
        Sharing::Engine => "places = engine, place_waits".into(),
        Sharing::EngineNoWaits => "places = engine (no waits, as shipped)".into(),
    }
}

/// A setup in a sentence.
fn setup_text((n, sharing): (usize, Sharing)) -> String {
    match (n, sharing) {
        (1, _) => "1 replica".into(),
        (n, Sharing::Parts) => format!("{n} replicas told (`admission.replicas = {n}`)"),
        (n, Sharing::NotTold) => format!("{n} replicas not told"),
        (n, Sharing::Engine) => {
            format!("{n} replicas asking the engines and waiting on them (`admission.place_waits`)")
        }
        (n, Sharing::EngineNoWaits) => {
            format!("{n} replicas asking the engines (`admission.places = \"engine\"`, no waits, as shipped)")
        }
    }
}

/// The two runs' records of the requests both sent, in the same order (a failed turn ends
/// its conversation, so a run may lack the later turns of one), and how many were left out.
fn aligned(
    base: &[RequestRecord],
    other: &[RequestRecord],
) -> (Vec<RequestRecord>, Vec<RequestRecord>, usize) {
    let by_index: BTreeMap<usize, &RequestRecord> = other.iter().map(|r| (r.index, r)).collect();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for r in base {
        if let Some(o) = by_index.get(&r.index) {
            a.push(r.clone());
            b.push((*o).clone());
        }
    }
    let left_out = base.len().max(other.len()) - a.len();
    (a, b, left_out)
}

/// One round's two runs, aligned on the requests both sent.
pub(crate) type RoundPair = (Vec<RequestRecord>, Vec<RequestRecord>);

/// Every tail's paired effect of `other` over `base` under `routing` (none where no round
/// ran both), and how many requests were left out of the pairs.
fn tail_effects(
    rounds: &[Vec<Run>],
    routing: &str,
    base: (usize, Sharing),
    other: (usize, Sharing),
) -> (Vec<(&'static str, Effect)>, usize) {
    let (owned, left_out) = paired_runs(rounds, routing, base, other);
    if owned.is_empty() {
        return (Vec::new(), left_out);
    }
    let pairs: Vec<(&[RequestRecord], &[RequestRecord])> =
        owned.iter().map(|(a, b)| (a.as_slice(), b.as_slice())).collect();
    (TAILS.iter().map(|&(name, tail)| (name, tail.effect(&pairs))).collect(), left_out)
}

/// Each round's two runs of `base` and `other` under `routing`, aligned on the requests
/// both sent, and how many requests were left out.
pub(crate) fn paired_runs(
    rounds: &[Vec<Run>],
    routing: &str,
    base: (usize, Sharing),
    other: (usize, Sharing),
) -> (Vec<RoundPair>, usize) {
    let mut pairs = Vec::new();
    let mut left_out = 0;
    for runs in rounds {
        if let (Some(b), Some(o)) = (run_of(runs, routing, base), run_of(runs, routing, other)) {
            let (a, c, left) = aligned(&b.records, &o.records);
            left_out += left;
            if !a.is_empty() {
                pairs.push((a, c));
            }
        }
    }
    (pairs, left_out)
}

/// What the engines' waits do: places from the engine with waits over the same without
/// them, on the same requests of the same round.
fn waits_section(md: &mut String, rounds: &[Vec<Run>]) {
    let _ = writeln!(
        md,
        "\n### What the waits on the engine do\n\n\
         Asking the engines for places, with the engines holding refused replicas' waits \
         (`admission.place_waits`; the engine wakes only the replica a freed place is kept \
         for, `Places::wakes`) over the same without them (the replicas ask again every \
         25 ms alone, as shipped), on the same requests of the same round, 90% interval as \
         above; below 1, the waits help.\n"
    );
    let _ = writeln!(md, "| routing | replicas | metric | with waits over without |");
    let _ = writeln!(md, "|---|---:|---|---:|");
    for routing in ROUTINGS {
        for n in [2, 4] {
            let (effects, _) =
                tail_effects(rounds, routing, (n, Sharing::EngineNoWaits), (n, Sharing::Engine));
            for (name, e) in effects {
                let _ = writeln!(
                    md,
                    "| {routing} | {n} | {name} | {} ({}–{}) |",
                    ratio_text(e.point),
                    ratio_text(e.lo),
                    ratio_text(e.hi)
                );
            }
        }
    }
}

/// The most requests any engine held at once, over the rounds, in a setup.
fn most_held(rounds: &[Vec<Run>], routing: &str, setup: (usize, Sharing)) -> f64 {
    rounds
        .iter()
        .filter_map(|runs| run_of(runs, routing, setup))
        .flat_map(|r| r.peaks.iter().copied())
        .fold(0.0, f64::max)
}

/// What the figures below come to, computed from them; and why the limit slips.
fn summary(md: &mut String, s: &Settings, rounds: &[Vec<Run>]) {
    let limit = f64::from(s.streams);
    let _ = writeln!(md, "## What it comes to\n");
    for routing in ROUTINGS {
        let held: Vec<String> = SETUPS
            .iter()
            .map(|&setup| {
                let most = most_held(rounds, routing, setup);
                let over = if most > limit {
                    format!(", {:.0}% over", 100.0 * (most / limit - 1.0))
                } else {
                    String::new()
                };
                format!("{} {most:.0}{over}", setup_text(setup))
            })
            .collect();
        let _ = writeln!(
            md,
            "- `{routing}`: the most requests an engine held at once, against its limit of {}: {}.",
            s.streams,
            held.join("; ")
        );
    }
    let beside = if s.page == "fleet" {
        "[The same run with readings every 50 ms](fleet-fast-readings.md) measures how much of the slip \
         the interval explains."
    } else {
        "[The bench's default run](fleet.md) is beside it."
    };
    let _ = writeln!(
        md,
        "\nWhy the limit slips with replicas that are not told how many they are: each replica \
         counts an engine's requests as the engine last reported them (every \
         `upstream.health_interval_s`, here {} s) plus what it sent itself since; what the other \
         replicas sent since is invisible to it until the next reading, so together they can fill \
         an engine's free places several times over. The requests past the limit run in the \
         engine's batch (or wait in vLLM's own queue once the batch is full), outside the \
         replicas' admission queues and their class order. Told (`admission.replicas`, \
         `admission.replica_index`), each replica holds at most its part of each engine's limit \
         (here {} of {} with two, {} with four), counted by its own open requests, so the parts \
         add up to the limit. Its cost is the pooling given up: a replica whose part is full \
         queues while another's part of the same engine stands idle, which shows in the start \
         times below. Asking the engines (`admission.places = \"engine\"`, ADR 0013), each \
         replica claims a request's place from the engine before sending it, stating the places \
         it holds; the engine, which every replica asks, grants while all the replicas' places \
         fit its limit, so the places go by need (one replica may hold every place while the \
         others are idle), at one round trip to the engine per request, and a refused request \
         waits in its replica's queue until a place frees (its own replica's at once; another's \
         when the replica next asks, every 25 ms); a freed place is kept for the \
         request that has waited longest at any replica (its class first) while its replica \
         still asks, as one queue would order them (a replica whose request got a place at \
         another engine, with nothing else waiting, withdraws its turn at once). That is how \
         the proxy ships; with \
         `admission.place_waits` a refused replica also waits on the engine, which wakes it \
         as soon as a place is there for it (only the replica whose request the place is kept \
         for), one round trip later, and sends its next request to that engine whatever its \
         routing would prefer: both are measured, on the same requests. {beside}\n",
        s.health_s,
        s.streams / 2,
        s.streams,
        s.streams / 4,
    );
}

fn hit_rate(r: &Run) -> f64 {
    if r.queried > 0.0 { r.hit / r.queried } else { f64::NAN }
}

/// A per-round entry's round, where the rounds ran different conditions (`uneven`): the
/// entries of one row would not line up with another's by position.
fn label(uneven: bool, round: usize) -> String {
    if uneven { format!("r{round} ") } else { String::new() }
}

pub(crate) fn ratio_text(x: f64) -> String {
    if x.is_finite() { format!("{x:.2}") } else { "∞".into() }
}

/// The command that measured one sitting: the first with every setting, each later one
/// adding its rounds (`FLEET_APPEND=1`) of the conditions it ran (`FLEET_ONLY`).
fn sitting_command(s: &Settings, t: &Sitting) -> String {
    let only = t.only.as_ref().map_or(String::new(), |c| {
        format!(" FLEET_ONLY={}", c.iter().map(|c| condition_name(*c)).collect::<Vec<_>>().join(","))
    });
    format!(
        "{}FLEET_ROUNDS={} FLEET_ENGINES={} FLEET_STREAMS={} FLEET_HEALTH_S={} FLEET_CONVERSATIONS={} FLEET_RATE={} FLEET_TURNS={}{}{}{only} scripts/bench-fleet.sh",
        if t.first > 0 { "FLEET_APPEND=1 " } else { "" },
        t.rounds,
        s.engines,
        s.streams,
        s.health_s,
        s.conversations,
        s.rate,
        s.shape.turns,
        if s.shape.system_tokens == SYSTEM_TOKENS {
            String::new()
        } else {
            format!(" FLEET_SYSTEM_TOKENS={}", s.shape.system_tokens)
        },
        if s.page == "fleet" { String::new() } else { format!(" FLEET_PAGE={}", s.page) },
    )
}

/// Which rounds ran which conditions, where a later sitting ran only some.
fn sittings_text(sittings: &[Sitting]) -> String {
    if sittings.iter().all(|t| t.only.is_none()) {
        return String::new();
    }
    let span = |t: &Sitting| match t.rounds {
        1 => format!("round {}", t.first),
        n => format!("rounds {}-{}", t.first, t.first + n - 1),
    };
    let parts: Vec<String> = sittings
        .iter()
        .map(|t| match &t.only {
            None => format!("{} ran every condition", span(t)),
            Some(c) => format!(
                "{} only {}",
                span(t),
                c.iter()
                    .map(|&(r, setup)| format!("`{r}` with {}", setup_text(setup)))
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
        })
        .collect();
    format!(
        " (measured in {} sittings: {}; each comparison pairs only the rounds that ran both of its conditions)",
        sittings.len(),
        parts.join("; ")
    )
}

pub(crate) fn report(s: &Settings, rounds: &[Vec<Run>], sittings: &[Sitting]) -> String {
    let mut md = String::new();
    let cmd = sittings.iter().map(|t| sitting_command(s, t)).collect::<Vec<_>>().join("\n");
    let wall_s: f64 = sittings.iter().map(|t| t.wall_s).sum();
    let most = rounds.iter().map(Vec::len).max().unwrap_or(0);
    let uneven = rounds.iter().any(|runs| runs.len() != most);
    let t = &s.shape.turn;
    let _ = write!(
        md,
        "# Several proxy replicas, the same engines\n\n\
         Generated by `loadtest/tester/benches/fleet/`; do not edit by hand. Reproduce with\n\n\
         ```text\n{cmd}\n```\n\n\
         Users who outgrow one proxy run several behind a Service. Each replica decides admission \
         and routing alone, from what the engines report (read every {health} s) and what it sent \
         itself since: do the replicas together keep every engine within its limit, and do \
         requests start and stream as fast as through one replica?\n\n\
         **Setup.** {engines} engine twins (`meridian-sim serve`, the `h100-qwen3-8b` profile in \
         real time, prefix cache on, stock's LRU eviction) serve one model. In front of them, 1, \
         2 or 4 proxy replicas (release build, each told of every engine), admission on at \
         **{streams} streams per engine**; two and four replicas told how many they are \
         (`admission.replicas` and each its `admission.replica_index`), not told \
         (`admission.replicas` left at 1, as before it existed), and asking the engines for \
         each request's place (`admission.places = \"engine\"`). Every replica reads the \
         engines through the policy channel's hello, each endpoint's `hook` being its twin, \
         which serves the hello (its requests by phase) and grants places with the table the \
         hook keeps (it takes no directives, so thinking is ended by vLLM's own budget field, \
         as with a hook that cannot end it). The load tester starts {conv} conversations of {turns} \
         turns at {rate} a second (Poisson), each opening with a shared system prompt of {sys} \
         tokens; each turn sends the history (earlier messages and answers, the thinking \
         dropped) and a new message of about {inp} tokens, thinks about {think} (its \
         `thinking_token_budget`) and answers about {out}, {think_time} s after the previous \
         answer; every turn names its conversation in `x-session-id`. Requests go to the \
         replicas in turn, as a Service spreads new connections, so a conversation's turns \
         land on different replicas. Routing: `phase-aware` (the default: fewest answering \
         streams, then KV pressure, then in flight) and `prefix-affinity` (a conversation to \
         one engine by rendezvous hashing of its key, the same in every replica, within a load \
         bound). {rounds} round(s){sittings}; each condition on fresh engines and proxies, the same \
         conversations (the round's seed) in each, the order rotated each round. All of it on \
         one 2-core machine: the engines, the replicas and the tester share its cores, so more \
         replicas also mean more processes competing for them.\n\n",
        health = s.health_s,
        engines = s.engines,
        streams = s.streams,
        conv = s.conversations,
        turns = s.shape.turns,
        rate = s.rate,
        sys = s.shape.system_tokens,
        inp = t.input,
        think = t.think.unwrap_or(0),
        out = t.output,
        think_time = s.shape.think_time_s,
        rounds = rounds.len(),
        sittings = sittings_text(sittings),
    );
    summary(&mut md, s, rounds);
    // Peaks against the limit.
    let _ = writeln!(md, "## Each engine within its limit\n");
    let _ = writeln!(
        md,
        "The most requests an engine held at once (running and waiting, taken at each arrival: \
         `meridian_sim_requests_peak`), against the limit of {} per engine. Target: never above it.\n",
        s.streams
    );
    let _ = writeln!(
        md,
        "| routing | replicas | `admission` | peak held, per round (each engine{}) | above the limit |",
        if uneven { "; `rN`: round N" } else { "" }
    );
    let _ = writeln!(md, "|---|---:|---:|---|---|");
    for routing in ROUTINGS {
        for setup in SETUPS {
            let (n, conf) = (setup.0, configured(setup));
            let peaks: Vec<(usize, &Vec<f64>)> = rounds
                .iter()
                .enumerate()
                .filter_map(|(i, runs)| Some((i, &run_of(runs, routing, setup)?.peaks)))
                .collect();
            let most = peaks.iter().flat_map(|(_, p)| p.iter()).copied().fold(0.0, f64::max);
            let text: Vec<String> = peaks
                .iter()
                .map(|(i, p)| {
                    label(uneven, *i) + &p.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" ")
                })
                .collect();
            let over = if most > f64::from(s.streams) {
                format!("**yes: {most:.0}, {:.0} over**", most - f64::from(s.streams))
            } else {
                "no".into()
            };
            let _ = writeln!(md, "| {routing} | {n} | {conf} | {} | {over} |", text.join("; "));
        }
    }
    // Tails against one replica.
    let _ = writeln!(md, "\n## Answers as through one replica\n");
    let _ = writeln!(
        md,
        "Each tail with 2 and 4 replicas, each way of sharing, over the same routing's with 1, on the same requests of \
         the same round (a request that failed counts as slower than any), with a 90% interval \
         from resampling the requests and the rounds. Target: within 10% (at most {TARGET_RATIO:.2}): \
         met when the whole interval is at or below it, missed when the whole interval is above, \
         otherwise unresolved.\n"
    );
    let _ = writeln!(md, "| routing | replicas | `admission` | metric | over 1 replica | verdict |");
    let _ = writeln!(md, "|---|---:|---:|---|---:|---|");
    let mut left_out_total = 0;
    for routing in ROUTINGS {
        for setup in SETUPS.into_iter().filter(|s| *s != ALONE) {
            let (n, conf) = (setup.0, configured(setup));
            let (effects, left) = tail_effects(rounds, routing, ALONE, setup);
            left_out_total += left;
            for (name, e) in effects {
                let _ = writeln!(
                    md,
                    "| {routing} | {n} | {conf} | {name} | {} ({}–{}) | {} |",
                    ratio_text(e.point),
                    ratio_text(e.lo),
                    ratio_text(e.hi),
                    verdict(&e)
                );
            }
        }
    }
    crate::tail::section(&mut md, rounds, s.engines * s.streams as usize);
    waits_section(&mut md, rounds);
    if left_out_total > 0 {
        let _ = writeln!(
            md,
            "\n{left_out_total} request(s) ran in only one of a pair of runs (a failed turn ends its \
             conversation) and are left out of the pairs."
        );
    }
    // Prefix hits.
    let _ = writeln!(md, "\n## The prefix caches\n");
    let _ = writeln!(
        md,
        "The share of prompt tokens the engines found in their prefix caches, summed over every \
         engine's own counters (`vllm:prefix_cache_hits_total` over `_queries_total`), each round. \
         The system prompt is shared by every conversation and a conversation's history by its \
         turns; only an engine that served a conversation before holds its history.\n"
    );
    let _ = writeln!(
        md,
        "| routing | replicas | `admission` | hit rate, per round | over 1 replica, per round |"
    );
    let _ = writeln!(md, "|---|---:|---:|---|---|");
    for routing in ROUTINGS {
        for setup in SETUPS {
            let (n, conf) = (setup.0, configured(setup));
            // Each round's rate where the setup ran; its ratio where one replica ran too.
            let rates: Vec<(usize, f64, Option<f64>)> = rounds
                .iter()
                .enumerate()
                .filter_map(|(i, runs)| {
                    let rate = hit_rate(run_of(runs, routing, setup)?);
                    Some((i, rate, run_of(runs, routing, ALONE).map(|b| rate / hit_rate(b))))
                })
                .collect();
            let shown: Vec<String> =
                rates.iter().map(|(i, r, _)| format!("{}{:.1}%", label(uneven, *i), 100.0 * r)).collect();
            let over: Vec<String> =
                rates.iter().filter_map(|(i, _, x)| Some(label(uneven, *i) + &ratio_text((*x)?))).collect();
            let over = if n == 1 { "—".into() } else { over.join(" ") };
            let _ = writeln!(md, "| {routing} | {n} | {conf} | {} | {over} |", shown.join(" "));
        }
    }
    // Runs.
    let _ = writeln!(md, "\n## Each run\n");
    let _ = writeln!(
        md,
        "Places asked of the engines (`places = engine`), summed over the replicas: claims granted, \
         refused (the request waited on in its replica's queue) and unanswered; and the waits a \
         refused replica held on a full engine (with `admission.place_waits`), woken (a place was \
         there for it, and the replica asked at once) or expired (the wait's time passed with \
         none for it; the replica also asks again every 25 ms while refused).\n"
    );
    let _ = writeln!(
        md,
        "| round | routing | replicas | `admission` | requests | failed | places: granted / refused / unanswered | waits: woken / expired / failed | wall time |"
    );
    let _ = writeln!(md, "|---:|---|---:|---:|---:|---:|---|---|---:|");
    for (i, runs) in rounds.iter().enumerate() {
        for r in runs {
            let failed = r.records.iter().filter(|x| !x.ok).count();
            let p = &r.places;
            let (claims, waits) = if r.sharing.asks_the_engine() {
                (
                    format!("{:.0} / {:.0} / {:.0}", p.granted, p.refused, p.unanswered),
                    format!("{:.0} / {:.0} / {:.0}", p.woken, p.expired, p.failed),
                )
            } else {
                ("—".into(), "—".into())
            };
            let _ = writeln!(
                md,
                "| {i} | {} | {} | {} | {} | {failed} | {claims} | {waits} | {:.0} s |",
                r.routing,
                r.replicas,
                configured((r.replicas, r.sharing)),
                r.records.len(),
                r.wall_s
            );
        }
    }
    let _ = writeln!(
        md,
        "\nThe bench took {:.0} minutes. Per-request figures, with every answer's gaps between tokens: `{}/runs.json.gz`.",
        wall_s / 60.0,
        s.page
    );
    md
}
