//! Assembles the router and runs the server.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceBuilder;
use tower::layer::util::{Identity, Stack};

use crate::layers::Wrap;
use crate::routes;
use crate::state::AppState;
use crate::upstream::HealthChecks;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(routes::chat_completions))
        .route("/v1/completions", post(routes::completions))
        .route("/v1/responses", post(routes::responses))
        .route("/v1/messages", post(routes::messages))
        .route("/v1/models", get(routes::list_models))
        .route("/health", get(routes::health))
        .route("/ready", get(routes::ready))
        .route("/metrics", get(routes::metrics))
        .fallback(routes::passthrough)
        // Ids, the outcome count, the head and body limits: `crate::layers`.
        .layer(whole_request(&state))
        .with_state(state)
}

/// The layers every proxied request passes, outermost first (the list in `crate::layers`).
pub type WholeRequest = Stack<
    Wrap<crate::body_limit::LimitBody>,
    Stack<
        Wrap<crate::head_limit::LimitHead>,
        Stack<
            Wrap<crate::telemetry::outcomes::CountOutcomes>,
            Stack<Wrap<crate::request_id::AssignIds>, Identity>,
        >,
    >,
>;

/// The stack of whole-request layers for `state`'s configuration.
pub fn whole_request(state: &Arc<AppState>) -> ServiceBuilder<WholeRequest> {
    let server = &state.config.server;
    ServiceBuilder::new()
        .layer(Wrap(crate::request_id::AssignIds))
        .layer(Wrap(crate::telemetry::outcomes::CountOutcomes::new(state.metrics.clone())))
        .layer(Wrap(crate::head_limit::LimitHead::new(server.max_header_bytes)))
        .layer(Wrap(crate::body_limit::LimitBody::new(server.max_body_bytes)))
}

/// How long, after the shutdown grace, the streams it ended get to write their error
/// events before their connections are closed regardless.
const FAREWELL: Duration = Duration::from_secs(2);

/// Accepts connections and serves `app` on each until `stopped` turns true; returns the
/// open connections, told to close once their requests are done.
///
/// An accept loop of our own rather than `axum::serve`, which runs hyper without a timer:
/// there, hyper's header read timeout is off and a client that never finishes its
/// headers holds a connection and a file descriptor for as long as it likes.
async fn accept_until(
    listener: TcpListener,
    app: Router,
    header_timeout: Duration,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> GracefulShutdown {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(header_timeout);
    let connections = GracefulShutdown::new();
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|s| *s) => break,
        };
        let tcp = match tcp {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of file descriptors, usually: wait for some to be freed.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Small SSE writes must leave at once, not wait for Nagle.
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), service).into_owned();
        let conn = connections.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    connections
}

/// A running proxy. Dropping it stops health checks; `shutdown` stops serving.
pub struct Server {
    pub local_addr: std::net::SocketAddr,
    /// Where the admin listener (`[admin]`) serves, when it is on.
    pub admin_addr: Option<std::net::SocketAddr>,
    admin: Option<(tokio::sync::watch::Sender<bool>, tokio::task::JoinHandle<()>)>,
    pub state: Arc<AppState>,
    stop: tokio::sync::watch::Sender<bool>,
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
    health: tokio::task::JoinHandle<()>,
    /// Admission control's release loop, when admission is on.
    pump: Option<tokio::task::JoinHandle<()>>,
    /// Folds histogram samples into buckets between scrapes; runs through a drain (open
    /// streams still record), stopped on drop.
    upkeep: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Binds, runs the first health-check round, and starts serving in the background.
    pub async fn start(state: AppState, listener: TcpListener) -> std::io::Result<Self> {
        let state = Arc::new(state);
        let local_addr = listener.local_addr()?;
        let u = &state.config.upstream;
        let health = HealthChecks {
            pool: state.pool.clone(),
            client: state.client.clone(),
            path: u.health_path.clone(),
            interval: Duration::from_secs_f64(u.health_interval_s),
            unhealthy_after: u.unhealthy_after,
            metrics: state.metrics.clone(),
            hook: state.hook.clone(),
            auth: state.upstream_auth.clone(),
            // Admission's engine limits read the gauges; so does load-aware routing, whose
            // choice only exists with more than one engine.
            engine_metrics: (state.admission.enabled() && state.admission.limits().reads_engine_metrics())
                || (u.endpoints.len() > 1 && u.routing.reads_kv_usage()),
        }
        .spawn()
        .await;
        let pump = state.admission.enabled().then(|| state.admission.clone().spawn_pump());
        let upkeep = crate::telemetry::spawn_upkeep(state.metrics.clone());
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let grace = Duration::from_secs_f64(state.config.server.shutdown_grace_s);
        let header_timeout = Duration::from_secs_f64(state.config.server.header_read_timeout_s);
        // The admin listener keeps serving through a drain, so an operator can watch the
        // open streams finish; it stops with the server.
        let (admin_addr, admin) = match &state.config.admin.listen {
            Some(addr) => {
                let (listener, app) =
                    crate::streams::serve_admin(addr, &state.config.admin.token_env, state.streams.clone())
                        .await
                        .map_err(std::io::Error::other)?;
                let local = listener.local_addr()?;
                let (admin_stop, admin_stopped) = tokio::sync::watch::channel(false);
                let task = tokio::spawn(async move {
                    let open = accept_until(listener, app, header_timeout, admin_stopped).await;
                    open.shutdown().await;
                });
                (Some(local), Some((admin_stop, task)))
            }
            None => (None, None),
        };
        let app = router(state.clone());
        let drain_state = state.clone();
        let serving = tokio::spawn(async move {
            let connections = accept_until(listener, app, header_timeout, stopped).await;
            let closing = connections.shutdown();
            tokio::pin!(closing);
            tokio::select! {
                _ = &mut closing => return Ok(()),
                _ = tokio::time::sleep(grace) => {}
            }
            // The grace is over: every response still open ends with an error event, and
            // the connections close once those are written.
            tracing::warn!(
                open = drain_state.streams.len(),
                "shutdown grace over; ending the requests still open"
            );
            drain_state.drain.end_grace();
            if tokio::time::timeout(FAREWELL, closing).await.is_err() {
                tracing::warn!("connections still open {FAREWELL:?} after the shutdown grace; closing them");
            }
            Ok(())
        });
        Ok(Server { local_addr, admin_addr, admin, state, stop, serving, health, pump, upkeep })
    }

    /// Drains: readiness fails and no request is taken from now on; open responses get
    /// `server.shutdown_grace_s` to finish, then end with an error event (`crate::drain`).
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        self.state.drain.begin();
        let _ = self.stop.send(true);
        self.health.abort();
        // The pump runs on while the open requests drain: those queued are still let
        // through as room frees, and with places granted by the engines this replica's
        // leases are still renewed, so an engine does not count the places of streams
        // still open here as free and grant them to other replicas.
        let served = (&mut self.serving).await.unwrap_or(Ok(()));
        if let Some(p) = &self.pump {
            p.abort();
        }
        if let Some((admin_stop, task)) = self.admin.take() {
            let _ = admin_stop.send(true);
            let _ = task.await;
        }
        served
    }

    /// Waits until the server stops on its own (it only does on error).
    pub async fn wait(&mut self) -> std::io::Result<()> {
        (&mut self.serving).await.unwrap_or(Ok(()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.health.abort();
        self.upkeep.abort();
        if let Some(p) = &self.pump {
            p.abort();
        }
        self.serving.abort();
        if let Some((_, task)) = &self.admin {
            task.abort();
        }
    }
}
