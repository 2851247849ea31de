//! A self-contained HTML report with inline SVG plots: latency CDFs per run, and load vs
//! latency when the run swept rates.

use std::fmt::Write;

use meridian_plot::{Series, escape, plot};

use crate::record::RequestRecord;
use crate::stats::RunSummary;

fn cdf(name: &str, mut values_ms: Vec<f64>) -> Series {
    values_ms.sort_by(|a, b| a.total_cmp(b));
    let n = values_ms.len() as f64;
    Series {
        name: name.to_owned(),
        points: values_ms.iter().enumerate().map(|(i, v)| (*v, (i + 1) as f64 / n)).collect(),
    }
}

/// The report for these runs (one per A/B side or sweep point).
pub fn html_report(runs: &[(&RunSummary, &[RequestRecord])], command: &str) -> String {
    let mut body = String::new();
    let _ = write!(body, "<h1>meridian-loadtest</h1><p><code>{}</code></p>", escape(command));
    let _ = write!(
        body,
        "<pre>{}</pre>",
        escape(&super::table(&runs.iter().map(|(s, _)| *s).collect::<Vec<_>>()))
    );
    type Pick = fn(&RequestRecord) -> Vec<f64>;
    let metrics: [(&str, Pick); 5] = [
        ("time to first output token", |r| r.ttfo.into_iter().collect()),
        ("largest gap in each answer", |r| r.max_output_gap.into_iter().collect()),
        ("think-to-output gap", |r| r.think_to_output.into_iter().collect()),
        ("output inter-token latency", |r| r.output_itl.clone()),
        ("time to first token", |r| r.ttft.into_iter().collect()),
    ];
    for (title, pick) in metrics {
        let series: Vec<Series> = runs
            .iter()
            .map(|(s, recs)| {
                cdf(&s.label, recs.iter().filter(|r| r.ok).flat_map(pick).map(|v| v * 1000.0).collect())
            })
            .collect();
        body.push_str(&plot(&format!("CDF of {title}"), "ms", "fraction of requests", &series));
    }
    let rates: Vec<&RunSummary> = runs.iter().map(|(s, _)| *s).filter(|s| s.offered_rate.is_some()).collect();
    if rates.len() > 1 {
        // A metric no request of a run reached has no point there.
        let line = |name: &str, f: fn(&RunSummary) -> &crate::stats::Summary, p99: bool| Series {
            name: name.to_owned(),
            points: rates
                .iter()
                .filter(|s| f(s).measured())
                .map(|s| (s.offered_rate.unwrap_or(0.0), if p99 { f(s).p99_ms } else { f(s).p50_ms }))
                .collect(),
        };
        body.push_str(&plot(
            "load vs latency",
            "offered request rate (req/s)",
            "ms",
            &[
                line("TTFO p50", |s| &s.ttfo, false),
                line("TTFO p99", |s| &s.ttfo, true),
                line("TTOT p99", |s| &s.think_to_output, true),
                line("output ITL p99", |s| &s.output_itl, true),
                line("largest answer gap p99", |s| &s.answer_gap, true),
            ],
        ));
    }
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>meridian-loadtest report</title></head><body>{body}</body></html>"
    )
}
