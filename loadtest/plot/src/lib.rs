//! Minimal SVG line plots for reports (the load tester's HTML page, the twin's A/B
//! report): no plotting library needed for a few lines on two axes.

use std::fmt::Write;

const COLORS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];
const W: f64 = 560.0;
const H: f64 = 300.0;
const PAD: f64 = 50.0;

/// One line of a plot.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Escapes text for SVG and HTML.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A line plot as a standalone SVG element (y from 0), one colour per series.
pub fn plot(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
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
