use std::time::Duration;

use super::catalogue::{self, Buckets, Kind};
use super::{Metrics, RequestTimings};

/// The value of the sample written exactly as `series` (name plus label set).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn all_timings() -> RequestTimings {
    RequestTimings {
        time_to_first_token: Some(Duration::from_millis(3)),
        time_to_first_output: Some(Duration::from_millis(300)),
        think_to_output_gap: Some(Duration::from_millis(20)),
        end_to_end: Duration::from_secs(2),
        think_tokens: Some(100),
        output_tokens: Some(7),
    }
}

#[test]
fn every_histogram_renders_its_buckets_type_and_help() {
    let m = Metrics::new();
    // Series registered on first use: one of each.
    m.record_timings("qwen3", &all_timings());
    m.count_request("chat", meridian_core::Outcome::Ok);
    m.count_budget_reached("qwen3");
    m.set_upstream_healthy("a:8000", true);
    m.output_itl("qwen3").record(0.02);
    let _acme = m.tenant_series("acme");
    let text = m.render();
    let mut histograms = 0;
    for def in catalogue::ALL {
        let kind = match def.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram(_) => "histogram",
        };
        assert!(text.contains(&format!("# HELP {} {}\n", def.name, def.help)), "{}: help\n{text}", def.name);
        assert!(text.contains(&format!("# TYPE {} {kind}\n", def.name)), "{}: type\n{text}", def.name);
        let Kind::Histogram(buckets) = def.kind else { continue };
        histograms += 1;
        let bucket = format!("{}_bucket{{", def.name);
        let line = text.lines().find(|l| l.starts_with(&bucket)).unwrap_or_else(|| panic!("{bucket}"));
        let labels = &line[bucket.len()..line.find(",le=").unwrap()];
        let les: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{bucket}{labels},le=")))
            .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next()?.parse().ok())
            .collect();
        let mut want = buckets.bounds();
        want.push(f64::INFINITY);
        assert_eq!(les, want, "{}", def.name);
    }
    assert_eq!(histograms, 8);
}

#[test]
fn buckets_are_the_bounds_the_proxy_always_had() {
    let lat = Buckets::Latency.bounds();
    assert_eq!((lat.len(), lat[0], lat[1], lat[19]), (20, 0.001, 0.002, 524.288));
    let tok = Buckets::Tokens.bounds();
    assert_eq!((tok.len(), tok[0], tok[17]), (18, 1.0, 131072.0));
}

#[test]
fn timings_land_in_the_right_buckets_by_family() {
    let m = Metrics::new();
    m.record_timings("qwen3", &all_timings());
    m.record_timings("qwen3", &RequestTimings { end_to_end: Duration::from_millis(5), ..Default::default() });
    let text = m.render();
    let ttft = "meridian_time_to_first_token_seconds";
    assert_eq!(value(&text, &format!("{ttft}_bucket{{family=\"qwen3\",le=\"0.002\"}}")), Some(0.0));
    assert_eq!(value(&text, &format!("{ttft}_bucket{{family=\"qwen3\",le=\"0.004\"}}")), Some(1.0));
    assert_eq!(value(&text, &format!("{ttft}_count{{family=\"qwen3\"}}")), Some(1.0));
    assert_eq!(value(&text, "meridian_request_duration_seconds_count{family=\"qwen3\"}"), Some(2.0));
    assert_eq!(value(&text, "meridian_think_tokens_bucket{family=\"qwen3\",le=\"128\"}"), Some(1.0));
    assert_eq!(value(&text, "meridian_think_tokens_bucket{family=\"qwen3\",le=\"64\"}"), Some(0.0));
    // Recorded per family, and only what was measured.
    m.record_timings("gpt-oss", &RequestTimings { end_to_end: Duration::from_secs(1), ..Default::default() });
    let text = m.render();
    assert_eq!(value(&text, "meridian_request_duration_seconds_count{family=\"gpt-oss\"}"), Some(1.0));
    assert!(!text.contains("meridian_think_to_output_gap_seconds_count{family=\"gpt-oss\"}"), "{text}");
}

#[test]
fn bounded_series_are_present_at_zero_from_the_start() {
    let text = Metrics::new().render();
    for class in ["output", "interactive", "batch"] {
        for name in [
            "meridian_admission_queued",
            "meridian_admission_admitted_total",
            "meridian_admission_timed_out_total",
            "meridian_admission_rejected_total",
            "meridian_admission_wait_seconds_count",
        ] {
            assert_eq!(value(&text, &format!("{name}{{class=\"{class}\"}}")), Some(0.0), "{name} {class}");
        }
    }
    for reason in ["budget_tokens", "budget_seconds", "rpdi", "eat"] {
        assert_eq!(value(&text, &format!("meridian_continuations_total{{reason=\"{reason}\"}}")), Some(0.0));
    }
    for (name, label) in [
        ("meridian_eat_probes_total", "outcome=\"ok\""),
        ("meridian_eat_probes_total", "outcome=\"failed\""),
        ("meridian_entropy_exits_total", "signal=\"eat\""),
        ("meridian_entropy_exits_total", "signal=\"rpdi\""),
        ("meridian_open_streams", "phase=\"pending\""),
        ("meridian_open_streams", "phase=\"think\""),
        ("meridian_open_streams", "phase=\"output\""),
    ] {
        assert_eq!(value(&text, &format!("{name}{{{label}}}")), Some(0.0), "{name}{{{label}}}");
    }
    assert_eq!(value(&text, "meridian_relayed_chunks_total"), Some(0.0));
    assert_eq!(value(&text, "meridian_upstream_retries_total"), Some(0.0));
}

#[test]
fn counters_and_gauges_count() {
    let m = Metrics::new();
    m.count_request("chat", meridian_core::Outcome::Ok);
    m.count_request("chat", meridian_core::Outcome::Ok);
    m.count_request("completions", meridian_core::Outcome::UpstreamError);
    for _ in 0..5 {
        m.count_chunk();
    }
    m.count_continuation("rpdi");
    m.count_budget_reached("qwen3");
    m.record_admission("batch", Duration::from_millis(30));
    m.count_admission_rejected("output");
    m.set_admission_queued("interactive", 4);
    m.set_upstream_in_flight("a:8000", 3);
    m.set_upstream_healthy("a:8000", true);
    m.set_hook_ready("a:8000", false);
    m.set_open_streams([0, 1, 1]);
    let text = m.render();
    for (series, want) in [
        ("meridian_requests_total{route=\"chat\",outcome=\"ok\"}", 2.0),
        ("meridian_requests_total{route=\"completions\",outcome=\"upstream_error\"}", 1.0),
        ("meridian_relayed_chunks_total", 5.0),
        ("meridian_continuations_total{reason=\"rpdi\"}", 1.0),
        ("meridian_think_budget_reached_total{family=\"qwen3\"}", 1.0),
        ("meridian_admission_admitted_total{class=\"batch\"}", 1.0),
        ("meridian_admission_wait_seconds_bucket{class=\"batch\",le=\"0.032\"}", 1.0),
        ("meridian_admission_rejected_total{class=\"output\"}", 1.0),
        ("meridian_admission_queued{class=\"interactive\"}", 4.0),
        ("meridian_upstream_in_flight{upstream=\"a:8000\"}", 3.0),
        ("meridian_upstream_healthy{upstream=\"a:8000\"}", 1.0),
        ("meridian_upstream_hook_ready{upstream=\"a:8000\"}", 0.0),
        ("meridian_open_streams{phase=\"think\"}", 1.0),
        ("meridian_open_streams{phase=\"output\"}", 1.0),
        ("meridian_open_streams{phase=\"pending\"}", 0.0),
    ] {
        assert_eq!(value(&text, series), Some(want), "{series}\n{text}");
    }
}

#[test]
fn two_instances_do_not_share_series() {
    let (a, b) = (Metrics::new(), Metrics::new());
    a.count_chunk();
    assert_eq!(value(&a.render(), "meridian_relayed_chunks_total"), Some(1.0));
    assert_eq!(value(&b.render(), "meridian_relayed_chunks_total"), Some(0.0));
}

#[test]
fn upkeep_keeps_samples() {
    let m = Metrics::new();
    m.record_timings("qwen3", &all_timings());
    m.run_upkeep();
    m.run_upkeep();
    assert_eq!(value(&m.render(), "meridian_request_duration_seconds_count{family=\"qwen3\"}"), Some(1.0));
}

#[test]
fn a_tenants_series_are_there_at_zero_once_it_is_registered() {
    let m = Metrics::new();
    let acme = m.tenant_series("acme");
    let text = m.render();
    for series in [
        "meridian_tenant_admitted_total{tenant=\"acme\"}",
        "meridian_tenant_refused_total{tenant=\"acme\",limit=\"max_streams\"}",
        "meridian_tenant_refused_total{tenant=\"acme\",limit=\"tokens_per_minute\"}",
        "meridian_tenant_open_streams{tenant=\"acme\"}",
        "meridian_tenant_generated_tokens_total{tenant=\"acme\"}",
    ] {
        assert_eq!(value(&text, series), Some(0.0), "{series}\n{text}");
    }
    acme.tokens.increment(42);
    assert_eq!(value(&m.render(), "meridian_tenant_generated_tokens_total{tenant=\"acme\"}"), Some(42.0));
}
