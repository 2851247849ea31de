//! What every handler shares.

use crate::hook::HookChannel;
use std::sync::Arc;
use std::time::Duration;

use crate::config::MeridianConfig;
use axum::http::HeaderValue;
use meridian_core::ModelRegistry;
use meridian_core::models::ModelFamily;

use crate::admission::Admission;
use crate::drain::Drain;
use crate::error::ProxyError;
use crate::share::{Roster, Split};
use crate::streams::OpenStreams;
use crate::telemetry::Metrics;
use crate::tenants::{TenantLease, Tenants};
use crate::upstream::UpstreamPool;

pub struct AppState {
    pub config: Arc<MeridianConfig>,
    pub models: Arc<ModelRegistry>,
    pub pool: Arc<UpstreamPool>,
    pub metrics: Arc<Metrics>,
    pub client: reqwest::Client,
    /// `Authorization` to send upstream, from `upstream.api_key_env`.
    pub upstream_auth: Option<HeaderValue>,
    /// The policy channel to the engines' hooks.
    pub hook: HookChannel,
    /// Admission control (`[admission]`).
    pub admission: Arc<Admission>,
    /// Whether the server is shutting down, and whether its grace is over.
    pub drain: Drain,
    /// Every request open right now (`crate::streams`).
    pub streams: Arc<OpenStreams>,
    /// Who requests are from and what each tenant may do (`[tenants]`; `None` when off).
    pub tenants: Option<Tenants>,
}

/// Why the proxy could not be assembled from a valid config.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot build the upstream HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("upstream.api_key_env: the value of {0} is not a valid header value")]
    ApiKey(String),
}

impl AppState {
    pub fn new(
        config: MeridianConfig,
        models: ModelRegistry,
        metrics: Arc<Metrics>,
    ) -> Result<Self, StateError> {
        let u = &config.upstream;
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs_f64(u.connect_timeout_s))
            .tcp_nodelay(true)
            // Shorter than the upstream's keep-alive (see the setting).
            .pool_idle_timeout(Duration::from_secs_f64(u.pool_idle_timeout_s))
            // A reverse proxy talks to its upstreams directly, whatever HTTP_PROXY says.
            .no_proxy()
            .build()?;
        let upstream_auth = match &u.api_key_env {
            Some(var) => {
                let key = std::env::var(var).unwrap_or_default();
                let mut v = HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| StateError::ApiKey(var.clone()))?;
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        let pool = Arc::new(UpstreamPool::new(&u.endpoints, u.routing.policy(u.affinity_load_bound)));
        for up in pool.all() {
            metrics.set_upstream_healthy(&up.name, true);
            metrics.set_upstream_in_flight(&up.name, 0);
            metrics.set_hook_ready(&up.name, false);
        }
        let streams = Arc::new(OpenStreams::default());
        let hook = HookChannel::new(&config.hook, client.clone()).with_streams(streams.clone());
        // The engines' word on the fleet, fed by this replica's places and read by the
        // tenants' split when it was not told its number.
        let roster = Arc::new(Roster::default());
        let tenants = Tenants::new(&config.tenants, Split::of(&config.admission, roster.clone()), &metrics);
        let flows = tenants.as_ref().map_or(1, Tenants::flows);
        let admission = Arc::new(Admission::new(
            &config.admission,
            flows,
            pool.clone(),
            metrics.clone(),
            hook.clone(),
            roster,
        ));
        Ok(AppState {
            admission,
            hook,
            config: Arc::new(config),
            models: Arc::new(models),
            pool,
            metrics,
            client,
            upstream_auth,
            drain: Drain::default(),
            streams,
            tenants,
        })
    }

    /// The metrics as a scrape sees them: the open-stream gauges read from the registry
    /// of open streams first.
    pub fn render_metrics(&self) -> String {
        self.metrics.set_open_streams(self.streams.streams_by_phase());
        self.metrics.render()
    }

    /// The tenant's lease for a request with `headers` (`[tenants]` on; `None` when off):
    /// 401 when it names no tenant and there is no default, 429 when its tenant is at a
    /// limit. Every route that reaches an engine takes one first.
    pub fn tenant_lease(&self, headers: &axum::http::HeaderMap) -> Result<Option<TenantLease>, ProxyError> {
        match &self.tenants {
            Some(tenants) => Ok(Some(tenants.identify(headers)?.lease(std::time::Instant::now())?)),
            None => Ok(None),
        }
    }

    /// The model family for a served model name: explicit alias, then the families'
    /// match patterns, then the configured default.
    pub fn family_for(&self, served_model: &str) -> Option<Arc<ModelFamily>> {
        let m = &self.config.models;
        m.aliases
            .get(served_model)
            .and_then(|name| self.models.get(name))
            .or_else(|| self.models.resolve(served_model))
            .or_else(|| m.default_family.as_deref().and_then(|name| self.models.get(name)))
            .cloned()
    }
}
