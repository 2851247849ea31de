//! What the server counts itself, read from its Prometheus `/metrics` before and after a
//! run: vLLM's prefix-cache look-ups and hits, in prompt tokens
//! (`vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`). They count every
//! look-up the engine made, a request resumed after preemption included, so they can
//! read above the hit rate the requests' own `cached_tokens` give.

use serde::Serialize;

const QUERIES: &str = "vllm:prefix_cache_queries_total";
const HITS: &str = "vllm:prefix_cache_hits_total";

/// The two counters at one moment, summed over their series (one per engine).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefixCacheCounters {
    pub queries: f64,
    pub hits: f64,
}

/// The counters' growth over a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PrefixCacheReading {
    pub queries: f64,
    pub hits: f64,
    /// `hits / queries`; `None` when nothing was looked up.
    pub hit_rate: Option<f64>,
}

/// The value of a sample line of `name` (bare or with labels), if the line is one.
fn sample(line: &str, name: &str) -> Option<f64> {
    let rest = line.strip_prefix(name)?;
    let value = match rest.as_bytes().first()? {
        b'{' => &rest[rest.find('}')? + 1..],
        b' ' => rest,
        _ => return None,
    };
    // A sample may carry a timestamp after its value.
    value.split_whitespace().next()?.parse().ok()
}

impl PrefixCacheCounters {
    /// From Prometheus' text format; `None` when the page has no such counters (a server
    /// that is not vLLM, or a proxy in front of one).
    pub fn parse(text: &str) -> Option<Self> {
        let (mut queries, mut hits) = (None::<f64>, None::<f64>);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            if let Some(v) = sample(line, QUERIES) {
                *queries.get_or_insert(0.0) += v;
            } else if let Some(v) = sample(line, HITS) {
                *hits.get_or_insert(0.0) += v;
            }
        }
        Some(PrefixCacheCounters { queries: queries?, hits: hits? })
    }

    /// Reads them from `url`; `None` when it cannot be read or has none.
    pub async fn read(client: &reqwest::Client, url: &str) -> Option<Self> {
        let resp = client.get(url).send().await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        Self::parse(&resp.text().await.ok()?)
    }

    /// What was counted between `before` and now.
    pub fn since(&self, before: &PrefixCacheCounters) -> PrefixCacheReading {
        let queries = self.queries - before.queries;
        let hits = self.hits - before.hits;
        PrefixCacheReading { queries, hits, hit_rate: (queries > 0.0).then(|| hits / queries) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As vLLM 0.32's API server exposes them (prometheus_client, one engine).
    const PAGE: &str = "\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"bench\"} 5120.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
vllm:prefix_cache_queries_created{engine=\"0\",model_name=\"bench\"} 1.76e+09
vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"bench\"} 2048.0
vllm:prefix_cache_hits_total{engine=\"1\",model_name=\"bench\"} 1024.0 1764000000000
vllm:external_prefix_cache_hits_total{engine=\"0\",model_name=\"bench\"} 9.0
";

    #[test]
    fn reads_vllms_counters_summed_over_engines() {
        let c = PrefixCacheCounters::parse(PAGE).unwrap();
        assert_eq!((c.queries, c.hits), (5120.0, 3072.0), "_created and external_ series are not counted");
        let before = PrefixCacheCounters { queries: 1024.0, hits: 0.0 };
        let r = c.since(&before);
        assert_eq!((r.queries, r.hits, r.hit_rate), (4096.0, 3072.0, Some(0.75)));
        assert_eq!(c.since(&c).hit_rate, None, "nothing looked up: no rate");
    }

    #[test]
    fn a_page_without_them_reads_as_none() {
        assert_eq!(PrefixCacheCounters::parse("# nothing\nmeridian_requests_total 3\n"), None);
        assert_eq!(PrefixCacheCounters::parse(""), None);
        let one = "vllm:prefix_cache_queries_total 10\n";
        assert_eq!(PrefixCacheCounters::parse(one), None, "both counters or neither");
        assert_eq!(
            PrefixCacheCounters::parse("vllm:prefix_cache_queries_total x\nvllm:prefix_cache_hits_total 1\n"),
            None
        );
    }
}
