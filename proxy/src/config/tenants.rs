//! Tenants (`[tenants]`, `[[tenants.tenant]]`): who a request is from, and what that
//! tenant may do: fields, defaults and checks. The proxy's side of it is `crate::tenants`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use meridian_core::config::Checker;

/// Where a request's tenant is read from.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum IdentifyBy {
    /// The client's API key (`Authorization: Bearer <key>`, or `x-api-key` as Anthropic's
    /// clients send it), matched against each tenant's `api_key_sha256`.
    #[default]
    ApiKey,
    /// A header a trusted gateway in front sets (`tenants.header`), naming the tenant.
    Header,
}

/// Tenants: requests are told apart by API key or by a trusted header, and each tenant
/// gets its own concurrency and token-rate limits, a fair share of the admission queue
/// within each class, its own think budgets, and vLLM priorities only if it is allowed
/// them. Off: every request is one tenant's, and a client's own priority is passed on.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TenantsConfig {
    /// Tell tenants apart ([Tenants](architecture/tenants.md)). On, a client's own vLLM
    /// priority (`priority` in the body, `X-Vllm-Priority`) is dropped unless its tenant has
    /// `allow_priority`.
    pub enabled: bool,
    /// Where a request's tenant comes from: `api-key` (the client's bearer token or
    /// `x-api-key`, matched by its SHA-256) or `header` (`tenants.header`, which only a
    /// gateway you trust may set: strip the clients' own there).
    pub identify_by: IdentifyBy,
    /// The header that names the tenant when `identify_by = "header"`.
    #[schemars(extend("x-range" = "an HTTP header name"))]
    pub header: String,
    /// The tenant of a request that names none of the listed ones (no key, an unknown key,
    /// no header or an unlisted name); they all share its limits. Unset: such a request is
    /// refused with 401 `invalid_api_key`.
    #[schemars(extend("x-range" = "names a listed tenant"))]
    pub default_tenant: Option<String>,
    /// The tenants, each with its limits.
    pub tenant: Vec<TenantConfig>,
}

impl Default for TenantsConfig {
    fn default() -> Self {
        TenantsConfig {
            enabled: false,
            identify_by: IdentifyBy::ApiKey,
            header: "x-meridian-tenant".into(),
            default_tenant: None,
            tenant: Vec::new(),
        }
    }
}

/// One tenant and its limits. Only `name` is required.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Its name: the `tenant` label of its metrics, and what `tenants.header` carries.
    #[schemars(extend("x-range" = "1-64 of `A-Za-z0-9._-`"))]
    pub name: String,
    /// SHA-256 digests (64 hex digits) of its API keys, so the file holds no key itself
    /// (`printf %s "$KEY"` piped through `sha256sum` prints one).
    #[schemars(extend("x-range" = "64 hex digits each"))]
    #[serde(default)]
    pub api_key_sha256: Vec<String>,
    /// Requests it may have open at once; one more gets 429 `rate_limit_exceeded` at once.
    /// Each proxy replica counts its own: replicas told their number
    /// (`admission.replicas`) each let in their part of it, so together they hold the
    /// tenant to it; not told, with `admission.places = "engine"` they split it by the
    /// replicas the engines count (an autoscaled fleet's number as it moves; a replica
    /// past the limit's places lets in none), and otherwise each lets in the whole.
    #[schemars(range(min = 1))]
    #[serde(default)]
    pub max_streams: Option<u32>,
    /// Generated tokens (thinking and answer) it may use per minute, as a bucket that holds
    /// one minute's worth and refills continuously. A request is let in while the bucket is
    /// not empty and pays for its tokens as they are counted at its end, so a request
    /// can take the bucket below zero; the tenant then gets 429 until it refills. Replicas
    /// told their number (`admission.replicas`) each hold `1/replicas` of it; not told,
    /// with `admission.places = "engine"`, `1/n` of it for the `n` replicas the engines
    /// count.
    #[schemars(range(min = 1))]
    #[serde(default)]
    pub tokens_per_minute: Option<u32>,
    /// Its share of the admission queue against other tenants waiting in the same class:
    /// a tenant of weight 2 is let through twice as often as one of weight 1 while both wait.
    #[schemars(range(min = 1, max = 1000))]
    #[serde(default = "weight_one")]
    pub weight: u32,
    /// Pass its own vLLM priority on (`priority` in the body, `X-Vllm-Priority`). Off, the
    /// proxy drops both, so no client can jump ahead of the others.
    #[serde(default)]
    pub allow_priority: bool,
    /// Its think budget in tokens: the budget of its requests that ask for none, and the
    /// most any of them gets (a larger one asked for is cut to it).
    #[schemars(range(min = 1))]
    #[serde(default)]
    pub think_budget_tokens: Option<u32>,
    /// Its thinking-time budget in seconds, the same way.
    #[schemars(extend("exclusiveMinimum" = 0))]
    #[serde(default)]
    pub think_budget_s: Option<f64>,
}

impl Default for TenantConfig {
    fn default() -> Self {
        TenantConfig {
            name: String::new(),
            api_key_sha256: Vec::new(),
            max_streams: None,
            tokens_per_minute: None,
            weight: weight_one(),
            allow_priority: false,
            think_budget_tokens: None,
            think_budget_s: None,
        }
    }
}

fn weight_one() -> u32 {
    1
}

/// Whether `name` may name a tenant (it becomes a metric label).
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl TenantsConfig {
    /// Every out-of-range or inconsistent value of this section, named by its dotted path.
    /// Its own checks, and its tenants' limits against the replicas that split them
    /// (`admission.replicas`).
    pub(super) fn check(&self, c: &mut Checker, admission: &super::AdmissionConfig) {
        if axum::http::HeaderName::from_bytes(self.header.as_bytes()).is_err() {
            c.fail("tenants.header", format!("must be an HTTP header name; got {:?}", self.header));
        }
        let mut names: Vec<&str> = Vec::new();
        let mut keys: Vec<String> = Vec::new();
        for (i, t) in self.tenant.iter().enumerate() {
            let at = |field: &str| format!("tenants.tenant[{i}].{field}");
            if !valid_name(&t.name) {
                c.fail(at("name"), format!("must be 1-64 of A-Za-z0-9._-; got {:?}", t.name));
            } else if names.contains(&t.name.as_str()) {
                c.fail(at("name"), format!("{:?} is listed twice", t.name));
            }
            names.push(&t.name);
            for (j, key) in t.api_key_sha256.iter().enumerate() {
                let digest = key.to_ascii_lowercase();
                if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                    c.fail(
                        format!("tenants.tenant[{i}].api_key_sha256[{j}]"),
                        "must be 64 hex digits (a SHA-256)",
                    );
                } else if keys.contains(&digest) {
                    c.fail(
                        format!("tenants.tenant[{i}].api_key_sha256[{j}]"),
                        "names a key another entry has",
                    );
                } else {
                    keys.push(digest);
                }
            }
            match t.max_streams {
                Some(0) => c.fail(at("max_streams"), "must be at least 1 (leave it unset for no limit)"),
                Some(m) if self.enabled && m < admission.replicas => c.fail(
                    at("max_streams"),
                    format!(
                        "is less than admission.replicas ({}): each replica lets in its part of it, and some would let in none",
                        admission.replicas
                    ),
                ),
                _ => {}
            }
            if t.tokens_per_minute == Some(0) {
                c.fail(at("tokens_per_minute"), "must be at least 1 (leave it unset for no limit)");
            }
            c.range_u32(&at("weight"), t.weight, 1, 1000);
            if t.think_budget_tokens == Some(0) {
                c.fail(at("think_budget_tokens"), "must be at least 1 (leave it unset for none)");
            }
            if let Some(s) = t.think_budget_s {
                c.positive(&at("think_budget_s"), s);
            }
        }
        if let Some(default) = &self.default_tenant
            && !names.contains(&default.as_str())
        {
            c.fail(
                "tenants.default_tenant",
                format!("names {default:?}, which is not in [[tenants.tenant]]"),
            );
        }
        if self.enabled && self.tenant.is_empty() {
            c.fail("tenants.enabled", "is true but no [[tenants.tenant]] is listed");
        }
        if self.enabled
            && self.identify_by == IdentifyBy::ApiKey
            && self.default_tenant.is_none()
            && self.tenant.iter().all(|t| t.api_key_sha256.is_empty())
        {
            c.fail(
                "tenants.identify_by",
                "is api-key but no tenant lists an api_key_sha256 and there is no default_tenant: every request would be refused",
            );
        }
    }
}
