use crate::stats::{RunSummary, Summary, TurnSummary};
use crate::whole_request::SloShare;

/// Runs side by side, one column each.
pub fn table(runs: &[&RunSummary]) -> String {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |name: &str, f: &dyn Fn(&RunSummary) -> String| {
        rows.push((name.to_owned(), runs.iter().map(|r| f(r)).collect()));
    };
    row("offered rate (req/s)", &|r| r.offered_rate.map_or("inf".into(), |x| format!("{x:.2}")));
    row("requests ok / failed", &|r| format!("{} / {}", r.completed, r.failed));
    row("duration (s)", &|r| format!("{:.2}", r.duration_s));
    row("request throughput (req/s)", &|r| format!("{:.2}", r.request_throughput));
    row("output token throughput (tok/s)", &|r| format!("{:.1}", r.output_token_throughput));
    row("total token throughput (tok/s)", &|r| format!("{:.1}", r.total_token_throughput));
    row("think / output tokens", &|r| format!("{} / {}", r.think_tokens, r.output_tokens));
    type Pick = fn(&RunSummary) -> &Summary;
    let metrics: [(&str, Pick); 8] = [
        ("TTFT", |r| &r.ttft),
        ("TTFO (first output token)", |r| &r.ttfo),
        ("think-to-output gap", |r| &r.think_to_output),
        ("ITL (all tokens)", |r| &r.itl),
        ("output ITL", |r| &r.output_itl),
        ("TPOT", |r| &r.tpot),
        ("E2E latency", |r| &r.e2el),
        ("largest answer gap", |r| &r.answer_gap),
    ];
    for (name, get) in metrics {
        row(&format!("{name} mean / p50 (ms)"), &|r| {
            let s = get(r);
            if s.measured() { format!("{:.2} / {:.2}", s.mean_ms, s.p50_ms) } else { "n/a".into() }
        });
        row(&format!("{name} p90 / p99 (ms)"), &|r| {
            let s = get(r);
            if s.measured() { format!("{:.2} / {:.2}", s.p90_ms, s.p99_ms) } else { "n/a".into() }
        });
    }
    row("answers stalled (largest gap over threshold)", &|r| match r.stalled_answers {
        Some(share) => format!("{:.1}% (> {:.0} ms)", share * 100.0, r.stall_threshold_ms),
        None => "n/a".into(),
    });
    row("goodput (req/s)", &|r| format!("{:.2} ({:.0}% good)", r.goodput, r.good_fraction * 100.0));
    let share = |s: &SloShare| match s.fraction {
        Some(f) => format!("{:.0}% ({} of {}), {:.2} req/s", f * 100.0, s.met, s.judged, s.per_s),
        None => "n/a".into(),
    };
    row("answer-only SLO (TTOT and answer gap within threshold)", &|r| share(&r.answer_only_slo));
    if runs.iter().any(|r| r.whole_request_slo.is_some()) {
        row("whole-request SLO (start vs alone, and the answer)", &|r| match &r.whole_request_slo {
            Some(w) => share(&w.share),
            None => "n/a".into(),
        });
    }
    if runs.iter().any(|r| r.prefix_cache.is_some()) {
        row("server prefix cache (hits / queried tokens)", &|r| match &r.prefix_cache {
            Some(p) => match p.hit_rate {
                Some(rate) => format!("{:.1}% ({:.0} / {:.0})", rate * 100.0, p.hits, p.queries),
                None => "nothing looked up".into(),
            },
            None => "n/a".into(),
        });
    }
    let turns = runs.iter().map(|r| r.turns.len()).max().unwrap_or(0);
    let turn_rows = |s: Option<&TurnSummary>| match s {
        Some(t) if t.ttft.measured() => {
            let hit = t.hit_rate.map_or("hit n/a".into(), |h| format!("hit {:.1}%", h * 100.0));
            format!("{:.0} / {:.0} ms, {hit} ({})", t.ttft.p50_ms, t.ttft.p95_ms, t.completed)
        }
        Some(t) => format!("no answer ({} sent)", t.requests),
        None => "n/a".into(),
    };
    for k in 0..turns {
        row(&format!("turn {}: TTFT p50 / p95, cached share (ok)", k + 1), &|r| turn_rows(r.turns.get(k)));
    }
    if turns > 1 {
        row("turns 2+: TTFT p50 / p95, cached share (ok)", &|r| turn_rows(r.later_turns.as_ref()));
    }
    let name_w = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let col_w: Vec<usize> = (0..runs.len())
        .map(|i| rows.iter().map(|(_, v)| v[i].len()).chain([runs[i].label.len()]).max().unwrap_or(0))
        .collect();
    let mut out = format!("{:name_w$}", "");
    for (i, r) in runs.iter().enumerate() {
        out.push_str(&format!("  {:>w$}", r.label, w = col_w[i]));
    }
    out.push('\n');
    for (name, vals) in &rows {
        out.push_str(&format!("{name:name_w$}"));
        for (i, v) in vals.iter().enumerate() {
            out.push_str(&format!("  {v:>w$}", w = col_w[i]));
        }
        out.push('\n');
    }
    out
}
