//! The engine gauges admission and routing read, from a vLLM server's Prometheus text
//! (scraped by the health checks beside each probe).
//!
//! Label sets vary between vLLM versions and deployments (`model_name`, `engine` for each
//! data-parallel rank, …), so samples are combined over them: waiting requests add up;
//! cache usage is a ratio per engine, so the fullest engine counts.

/// What one `/metrics` scrape says about an engine's load.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineLoad {
    /// `vllm:num_requests_running`, summed over label sets.
    pub running: Option<f64>,
    /// `vllm:num_requests_waiting`, summed over label sets.
    pub waiting: Option<f64>,
    /// `vllm:kv_cache_usage_perc` (older servers: `vllm:gpu_cache_usage_perc`), 0-1, the
    /// highest over label sets.
    pub kv_usage: Option<f64>,
}

const RUNNING: &str = "vllm:num_requests_running";
const WAITING: &str = "vllm:num_requests_waiting";
const KV_USAGE: [&str; 2] = ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"];

/// Reads the gauges from Prometheus text exposition (0.0.4 or OpenMetrics). Lines it does
/// not understand are skipped, never an error.
pub fn parse(text: &str) -> EngineLoad {
    let mut load = EngineLoad::default();
    let mut kv_from_new_name = false;
    for line in text.lines() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = sample(line) else { continue };
        if !value.is_finite() {
            continue;
        }
        if name == WAITING {
            load.waiting = Some(load.waiting.unwrap_or(0.0) + value);
        } else if name == RUNNING {
            load.running = Some(load.running.unwrap_or(0.0) + value);
        } else if let Some(i) = KV_USAGE.iter().position(|n| *n == name) {
            // The current name wins over the deprecated one when a server exports both.
            let new = i == 0;
            if new && !kv_from_new_name {
                load.kv_usage = None;
                kv_from_new_name = true;
            }
            if new || !kv_from_new_name {
                load.kv_usage = Some(load.kv_usage.map_or(value, |v: f64| v.max(value)));
            }
        }
    }
    load
}

/// `name{labels} value [timestamp]` → (name, value). Label values may hold spaces, braces
/// and escaped quotes.
fn sample(line: &str) -> Option<(&str, f64)> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    if rest.starts_with('{') {
        let close = labels_end(rest)?;
        rest = &rest[close + 1..];
    }
    let value = rest.split_whitespace().next()?;
    Some((name, value.parse().ok()?))
}

/// Index of the `}` closing a label set that starts at index 0.
fn labels_end(s: &str) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_quotes => escaped = true,
            '"' => in_quotes = !in_quotes,
            '}' if !in_quotes => return Some(i),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_running_and_waiting_and_takes_the_fullest_cache_over_label_sets() {
        let text = r#"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 4.0
vllm:num_requests_waiting_total 100
vllm:kv_cache_usage_perc{engine="0",model_name="a } \" b"} 0.5 1712345678000
vllm:kv_cache_usage_perc{engine="1",model_name="x"} 0.93
vllm:num_requests_running{engine="0"} 9
vllm:num_requests_running{engine="1"} 2
"#;
        assert_eq!(parse(text), EngineLoad { running: Some(11.0), waiting: Some(7.0), kv_usage: Some(0.93) });
    }

    #[test]
    fn unlabelled_old_names_and_garbage() {
        let text = "vllm:num_requests_waiting 2\nvllm:gpu_cache_usage_perc 0.4\nnot a metric\nvllm:kv{ 1\n\
                    vllm:num_requests_waiting{a=\"b\"} NaN\n";
        assert_eq!(parse(text), EngineLoad { running: None, waiting: Some(2.0), kv_usage: Some(0.4) });
        let both = "vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.2\n";
        assert_eq!(parse(both).kv_usage, Some(0.2), "the current name wins");
        assert_eq!(parse(""), EngineLoad::default());
    }
}
