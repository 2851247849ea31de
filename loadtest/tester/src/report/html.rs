//! A self-contained HTML report with inline SVG plots: latency CDFs per run, and load vs
//! latency when the run swept rates.

use std::fmt::Write;

use crate::record::RequestRecord;
use crate::stats::RunSummary;

const COLORS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];
const W: f64 = 560.0;
const H: f64 = 300.0;
const PAD: f64 = 50.0;

struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn plot(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in all {
        x0 = x0.min(*x);
        x1 = x1.max(*x);
        y0 = y0.min(*y);
        y1 = y1.max(*y);
    }
    if x0 > x1 {
        return format!("<p>{}: no data</p>", escape(title));
    }
    y0 = y0.min(0.0);
    if x1 - x0 < 1e-12 {
        x1 = x0 + 1.0;
    }
    if y1 - y0 < 1e-12 {
        y1 = y0 + 1.0;
    }
    let sx = |x: f64| PAD + (x - x0) / (x1 - x0) * (W - 2.0 * PAD);
    let sy = |y: f64| H - PAD + -(y - y0) / (y1 - y0) * (H - 2.0 * PAD);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"11\">"
    );
    let _ = write!(
        svg,
        "<text x=\"{}\" y=\"18\" text-anchor=\"middle\" font-size=\"13\">{}</text>",
        W / 2.0,
        escape(title)
    );
    let _ = write!(
        svg,
        "<line x1=\"{PAD}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>",
        H - PAD,
        W - PAD,
        H - PAD
    );
    let _ = write!(svg, "<line x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{}\" stroke=\"#333\"/>", H - PAD);
    for i in 0..=4 {
        let fx = x0 + (x1 - x0) * f64::from(i) / 4.0;
        let fy = y0 + (y1 - y0) * f64::from(i) / 4.0;
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{fx:.3}</text>",
            sx(fx),
            H - PAD + 15.0
        );
        let _ = write!(
            svg,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{fy:.2}</text>",
            PAD - 4.0,
            sy(fy) + 4.0
        );
    }
    let _ = write!(
        svg,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
        W / 2.0,
        H - 12.0,
        escape(x_label)
    );
    let _ = write!(
        svg,
        "<text x=\"12\" y=\"{}\" transform=\"rotate(-90 12 {})\" text-anchor=\"middle\">{}</text>",
        H / 2.0,
        H / 2.0,
        escape(y_label)
    );
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = s.points.iter().map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y))).collect();
        let _ = write!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>",
            pts.join(" ")
        );
        let _ = write!(
            svg,
            "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{}</text>",
            W - PAD - 120.0,
            PAD + 14.0 * i as f64,
            escape(&s.name)
        );
    }
    svg.push_str("</svg>");
    svg
}

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
    let metrics: [(&str, Pick); 4] = [
        ("time to first output token", |r| r.ttfo.into_iter().collect()),
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
        let line = |name: &str, f: fn(&RunSummary) -> f64| Series {
            name: name.to_owned(),
            points: rates.iter().map(|s| (s.offered_rate.unwrap_or(0.0), f(s))).collect(),
        };
        body.push_str(&plot(
            "load vs latency",
            "offered request rate (req/s)",
            "ms",
            &[
                line("TTFO p50", |s| s.ttfo.p50_ms),
                line("TTFO p99", |s| s.ttfo.p99_ms),
                line("TTOT p99", |s| s.think_to_output.p99_ms),
                line("output ITL p99", |s| s.output_itl.p99_ms),
            ],
        ));
    }
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>meridian-loadtest report</title></head><body>{body}</body></html>"
    )
}
