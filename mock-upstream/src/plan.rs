use std::time::Duration;

use axum::http::HeaderMap;

/// How a fixture is delivered, read from the request's `x-mock-*` headers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeliveryPlan {
    pub fixture: Option<String>,
    pub split: Split,
    pub interval: Duration,
    pub first_byte_delay: Duration,
    pub die_after_bytes: Option<usize>,
    pub hang_after_bytes: Option<usize>,
    pub status: Option<u16>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub enum Split {
    /// One write per SSE event.
    #[default]
    Event,
    /// Writes of this many bytes.
    Every(usize),
    /// Cuts at these byte offsets.
    At(Vec<usize>),
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::trim)
}

fn number<T: std::str::FromStr>(h: &HeaderMap, name: &str) -> Option<T> {
    header(h, name).and_then(|v| v.parse().ok())
}

impl DeliveryPlan {
    pub fn from_headers(h: &HeaderMap) -> Self {
        let split = match header(h, "x-mock-split") {
            None | Some("event") => Split::Event,
            Some(v) if v.contains(',') => {
                Split::At(v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
            }
            Some(v) => v.parse().map(|n: usize| Split::Every(n.max(1))).unwrap_or(Split::Event),
        };
        DeliveryPlan {
            fixture: header(h, "x-mock-fixture").map(str::to_owned),
            split,
            interval: Duration::from_millis(number(h, "x-mock-interval-ms").unwrap_or(0)),
            first_byte_delay: Duration::from_millis(number(h, "x-mock-first-byte-ms").unwrap_or(0)),
            die_after_bytes: number(h, "x-mock-die-after-bytes"),
            hang_after_bytes: number(h, "x-mock-hang-after-bytes"),
            status: number(h, "x-mock-status"),
        }
    }

    /// Cut points (exclusive ends) for a body of `len` bytes with these event ends.
    pub fn cuts(&self, len: usize, event_ends: &[usize]) -> Vec<usize> {
        let mut cuts: Vec<usize> = match &self.split {
            Split::Event => event_ends.to_vec(),
            Split::Every(n) => (1..=len.div_ceil(*n)).map(|i| (i * n).min(len)).collect(),
            Split::At(offsets) => {
                offsets.iter().copied().filter(|&o| o > 0 && o < len).chain([len]).collect()
            }
        };
        cuts.sort_unstable();
        cuts.dedup();
        cuts.retain(|&c| c > 0);
        cuts
    }
}
