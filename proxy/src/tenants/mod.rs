//! Tenants (`[tenants]`): who a request is from, and what that tenant may do. A request
//! names its tenant by API key or by a header a trusted gateway sets; its tenant's limits
//! (requests open at once, generated tokens a minute) let it in or answer 429 before
//! anything is read from its body or sent upstream; and what it is allowed (its own vLLM
//! priority, its think budgets) is applied where the request is decided
//! (`routes::generate::decide`). Its share of the admission queue is its flow there
//! (`crate::admission::queue`, weighted fair within each class).
//!
//! The request holds a [`TenantLease`] in its context for as long as it lives: the open
//! slot is handed back, and its generated tokens charged, when the last stage lets go.
//!
//! Several proxy replicas told their number (`admission.replicas`, and each its
//! `admission.replica_index`) split every tenant's limits as they split each engine's
//! (`crate::share`): replica `i` of `n` lets in at most its part of the
//! tenant's `max_streams` (the leftovers to the lowest indexes) and `1/n` of its
//! `tokens_per_minute`, so together they hold the tenant to its limits, at the cost of the
//! pooling (a replica whose part is spent refuses while another's stands unused). Not
//! told, they split by the replicas the engines count (`crate::share::Roster`, from the
//! answers to their claims on the engines' places, `admission.places = "engine"`), which
//! follows an autoscaler; with no such word (places decided by each replica), each
//! replica holds the whole limits, and a tenant spread over `n` replicas gets up to `n`
//! times them.

mod bucket;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::http::{HeaderMap, HeaderName, header};
use sha2::{Digest, Sha256};

pub use bucket::TokenBucket;

use crate::config::{IdentifyBy, TenantConfig, TenantsConfig};
use crate::error::{ProxyError, TenantLimit};
use crate::share::Split;
use crate::telemetry::{Metrics, TenantSeries};

/// One tenant: what the config says of it, and what it holds right now.
pub struct Tenant {
    pub name: String,
    /// Its flow in the admission queue.
    pub flow: usize,
    pub weight: u32,
    pub allow_priority: bool,
    pub think_budget_tokens: Option<u32>,
    pub think_budget_s: Option<f64>,
    /// The tenant's whole limit; this replica lets in its part ([`Split`]).
    max_streams: Option<u32>,
    split: Split,
    open: AtomicU32,
    bucket: Option<Mutex<TokenBucket>>,
    series: TenantSeries,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant").field("name", &self.name).field("open", &self.open).finish_non_exhaustive()
    }
}

impl Tenant {
    /// `cfg`'s tenant, holding this replica's part of its limits (`split`).
    fn new(cfg: &TenantConfig, flow: usize, split: Split, metrics: &Metrics, now: Instant) -> Self {
        Tenant {
            name: cfg.name.clone(),
            flow,
            weight: cfg.weight.max(1),
            allow_priority: cfg.allow_priority,
            think_budget_tokens: cfg.think_budget_tokens,
            think_budget_s: cfg.think_budget_s,
            max_streams: cfg.max_streams,
            open: AtomicU32::new(0),
            // Whole here: each lease splits it by the fleet of the moment first.
            bucket: cfg.tokens_per_minute.map(|n| Mutex::new(TokenBucket::new(f64::from(n), now))),
            split,
            series: metrics.tenant_series(&cfg.name),
        }
    }

    fn bucket(&self) -> Option<std::sync::MutexGuard<'_, TokenBucket>> {
        // A bucket is plain numbers: consistent whatever panicked while holding it.
        self.bucket.as_ref().map(|b| b.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The most requests of this tenant this replica lets in at once now (its part of
    /// the tenant's `max_streams`); `None`: no limit.
    pub fn max_streams(&self) -> Option<u32> {
        let fleet = self.split.fleet(Instant::now());
        self.max_streams.map(|m| fleet.part(m))
    }

    /// Requests of this tenant open now.
    pub fn open(&self) -> u32 {
        self.open.load(Ordering::Relaxed)
    }

    fn refuse(&self, limit: TenantLimit, retry_after_s: u64) -> ProxyError {
        self.series.refused[limit as usize].increment(1);
        ProxyError::RateLimited { tenant: self.name.clone(), limit, retry_after_s }
    }

    /// Lets one more request in, or says which limit it is at.
    pub fn lease(self: &Arc<Self>, now: Instant) -> Result<TenantLease, ProxyError> {
        let fleet = self.split.fleet(now);
        if let Some(mut bucket) = self.bucket() {
            bucket.split(fleet.replicas(), now);
            if let Err(wait) = bucket.admit(now) {
                return Err(self.refuse(TenantLimit::TokensPerMinute, wait.as_secs_f64().ceil() as u64));
            }
        }
        // With more replicas than the limit has places (counted, not told: told, it is
        // refused at start), some replicas' part is none, and they refuse until the
        // fleet shrinks: the tenant is held to its limit, spread as it can be.
        let max = self.max_streams.map_or(u32::MAX, |m| fleet.part(m));
        let taken =
            self.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1));
        match taken {
            Ok(_) => {
                self.series.admitted.increment(1);
                self.series.open.increment(1.0);
                Ok(TenantLease { tenant: self.clone() })
            }
            // A slot frees when one of its requests ends; a second is a fair guess.
            Err(_) => Err(self.refuse(TenantLimit::MaxStreams, 1)),
        }
    }
}

/// A request's place among its tenant's open ones; handed back when dropped.
#[derive(Debug)]
pub struct TenantLease {
    tenant: Arc<Tenant>,
}

impl TenantLease {
    pub fn tenant(&self) -> &Arc<Tenant> {
        &self.tenant
    }

    /// Charges the request's generated tokens to its tenant (once, at its end).
    pub fn spend(&self, tokens: u64) {
        self.tenant.series.tokens.increment(tokens);
        if let Some(mut bucket) = self.tenant.bucket() {
            bucket.spend(tokens, Instant::now());
        }
    }
}

impl Drop for TenantLease {
    fn drop(&mut self) {
        self.tenant.open.fetch_sub(1, Ordering::AcqRel);
        self.tenant.series.open.decrement(1.0);
    }
}

/// Every tenant, and how a request is told to be one of them.
pub struct Tenants {
    identify_by: IdentifyBy,
    header: Option<HeaderName>,
    default: Option<Arc<Tenant>>,
    by_name: HashMap<String, Arc<Tenant>>,
    /// By the SHA-256 of each API key. Looking a digest up leaks nothing usable about a
    /// key through timing: the digest of a guess says nothing of how close it was.
    by_key: HashMap<[u8; 32], Arc<Tenant>>,
}

impl Tenants {
    /// The tenants of a valid `[tenants]` section, each holding this replica's part of its
    /// limits (`split`: by the replicas told `admission.replicas`, else by those the
    /// engines count); `None` when it is off.
    pub fn new(cfg: &TenantsConfig, split: Split, metrics: &Metrics) -> Option<Self> {
        if !cfg.enabled {
            return None;
        }
        if let Split::Told(fleet) = &split
            && fleet.replicas() > 1
        {
            tracing::info!(
                replicas = fleet.replicas(),
                "tenants: this replica holds its part of each tenant's limits"
            );
        }
        let now = Instant::now();
        let all: Vec<Arc<Tenant>> = cfg
            .tenant
            .iter()
            .enumerate()
            .map(|(i, t)| Arc::new(Tenant::new(t, i, split.clone(), metrics, now)))
            .collect();
        let by_name: HashMap<String, Arc<Tenant>> = all.iter().map(|t| (t.name.clone(), t.clone())).collect();
        let mut by_key = HashMap::new();
        for (t, tc) in all.iter().zip(&cfg.tenant) {
            for hex in &tc.api_key_sha256 {
                if let Some(digest) = decode_digest(hex) {
                    by_key.insert(digest, t.clone());
                }
            }
        }
        Some(Tenants {
            identify_by: cfg.identify_by,
            header: HeaderName::from_bytes(cfg.header.as_bytes()).ok(),
            default: cfg.default_tenant.as_ref().and_then(|n| by_name.get(n).cloned()),
            by_name,
            by_key,
        })
    }

    /// How many flows the admission queue keeps apart: one per tenant.
    pub fn flows(&self) -> usize {
        self.by_name.len()
    }

    /// The tenant a request with `headers` is from: the one its key or header names,
    /// else the default tenant, else 401.
    pub fn identify(&self, headers: &HeaderMap) -> Result<&Arc<Tenant>, ProxyError> {
        let named = match self.identify_by {
            IdentifyBy::ApiKey => {
                api_key(headers).and_then(|key| self.by_key.get(&<[u8; 32]>::from(Sha256::digest(key))))
            }
            IdentifyBy::Header => self
                .header
                .as_ref()
                .and_then(|h| headers.get(h))
                .and_then(|v| v.to_str().ok())
                .and_then(|name| self.by_name.get(name.trim())),
        };
        named.or(self.default.as_ref()).ok_or(ProxyError::Unauthorized {
            reason: match self.identify_by {
                IdentifyBy::ApiKey => "the API key is missing or not known here",
                IdentifyBy::Header => "the request names no tenant known here",
            },
        })
    }
}

/// The client's API key: `Authorization: Bearer <key>` (OpenAI's clients), else
/// `x-api-key` (Anthropic's).
fn api_key(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(v) = headers.get(header::AUTHORIZATION) {
        let v = v.as_bytes();
        let scheme = v.get(..7)?;
        return scheme
            .eq_ignore_ascii_case(b"bearer ")
            .then(|| v[7..].trim_ascii())
            .filter(|k| !k.is_empty());
    }
    headers.get("x-api-key").map(|v| v.as_bytes().trim_ascii()).filter(|k| !k.is_empty())
}

fn decode_digest(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests;
