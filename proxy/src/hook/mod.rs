//! The proxy's end of the policy channel to Meridian's in-engine vLLM hook
//! (`meridian_core::channel`): checks each hook's protocol in the health loop, and sends
//! directives. An upstream whose hook does not answer is driven through its HTTP API
//! alone (vLLM's `thinking_token_budget`), so a missing hook costs features, not requests.

use std::sync::Arc;
use std::time::Duration;

use meridian_core::channel::Action;

use crate::config::HookConfig;
use axum::http::HeaderValue;
use meridian_core::channel::{
    Accepted, Claim, DIRECTIVES_PATH, Directive, DirectiveBatch, Granted, HELLO_PATH, Hello, PLACES_PATH,
    PLACES_WAIT_PATH, PROTOCOL_HEADER, PROTOCOL_VERSION, PlacesFreed, PlacesWait,
};

use crate::streams::{Ending, OpenStreams};

/// Why a hook could not be reached or refused a message.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("no channel secret: environment variable {0} is not set")]
    NoSecret(String),
    #[error("hook at {addr} unreachable: {reason}")]
    Unreachable { addr: String, reason: String },
    #[error("hook at {addr} answered {status}: {body}")]
    Refused { addr: String, status: u16, body: String },
    #[error("hook at {addr} speaks protocol {theirs}, this proxy {PROTOCOL_VERSION}")]
    Version { addr: String, theirs: u32 },
}

/// Talks to the hooks of all upstreams with one shared secret.
#[derive(Clone)]
pub struct HookChannel {
    client: reqwest::Client,
    secret: Result<HeaderValue, String>,
    timeout: Duration,
    /// Where a directive to end a stream's thinking is noted, for operators.
    streams: Option<Arc<OpenStreams>>,
}

impl HookChannel {
    pub fn new(cfg: &HookConfig, client: reqwest::Client) -> Self {
        let secret = match std::env::var(&cfg.token_env) {
            Ok(s) if !s.trim().is_empty() => HeaderValue::from_str(&format!("Bearer {}", s.trim()))
                .map(|mut v| {
                    v.set_sensitive(true);
                    v
                })
                .map_err(|_| cfg.token_env.clone()),
            _ => Err(cfg.token_env.clone()),
        };
        HookChannel { client, secret, timeout: Duration::from_secs_f64(cfg.timeout_s), streams: None }
    }

    /// A channel with `secret`, for tests that serve a hook of their own.
    #[cfg(test)]
    pub(crate) fn with_secret(secret: &str, timeout: Duration) -> Self {
        let secret = HeaderValue::from_str(&format!("Bearer {secret}")).map_err(|_| "secret".to_owned());
        HookChannel { client: reqwest::Client::new(), secret, timeout, streams: None }
    }

    /// Notes each `end_thinking` directive on the stream it names in `streams`.
    pub fn with_streams(mut self, streams: Arc<OpenStreams>) -> Self {
        self.streams = Some(streams);
        self
    }

    fn request(
        &self,
        method: reqwest::Method,
        addr: &str,
        path: &str,
    ) -> Result<reqwest::RequestBuilder, HookError> {
        let auth = self.secret.clone().map_err(HookError::NoSecret)?;
        Ok(self
            .client
            .request(method, format!("http://{addr}{path}"))
            .timeout(self.timeout)
            .header(reqwest::header::AUTHORIZATION, auth)
            .header(PROTOCOL_HEADER, PROTOCOL_VERSION))
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        addr: &str,
        req: reqwest::RequestBuilder,
    ) -> Result<T, HookError> {
        let unreachable =
            |e: reqwest::Error| HookError::Unreachable { addr: addr.to_owned(), reason: e.to_string() };
        let resp = req.send().await.map_err(unreachable)?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            return Err(HookError::Refused { addr: addr.to_owned(), status: status.as_u16(), body });
        }
        resp.json::<T>().await.map_err(unreachable)
    }

    /// Asks a hook what it is; fails unless it speaks this proxy's protocol.
    pub async fn hello(&self, addr: &str) -> Result<Hello, HookError> {
        let hello: Hello = self.call(addr, self.request(reqwest::Method::GET, addr, HELLO_PATH)?).await?;
        if !(hello.min_protocol..=hello.protocol).contains(&PROTOCOL_VERSION) {
            return Err(HookError::Version { addr: addr.to_owned(), theirs: hello.protocol });
        }
        Ok(hello)
    }

    /// Claims a place in the engine's limit, or reports this replica's holding
    /// (`meridian_core::channel::places`), waiting at most `within` (and the channel's
    /// own timeout) for the answer.
    pub async fn claim(&self, addr: &str, claim: &Claim, within: Duration) -> Result<Granted, HookError> {
        let req = self
            .request(reqwest::Method::POST, addr, PLACES_PATH)?
            .json(claim)
            .timeout(self.timeout.min(within));
        self.call(addr, req).await
    }

    /// Waits, up to `wait`, for a place to be there for `holder` (the engine's table
    /// would grant its refused claim now; `after`: the count of openings its refusal
    /// carried); the engine's answer, which says whether it woke or ran out. The answer
    /// itself gets `within` beyond the wait.
    pub async fn wait_for_place(
        &self,
        addr: &str,
        holder: &str,
        after: u64,
        wait: Duration,
        within: Duration,
    ) -> Result<PlacesFreed, HookError> {
        let body = PlacesWait { after, wait_s: wait.as_secs_f64(), holder: Some(holder.to_owned()) };
        let req =
            self.request(reqwest::Method::POST, addr, PLACES_WAIT_PATH)?.json(&body).timeout(wait + within);
        self.call(addr, req).await
    }

    /// Sends directives to a hook.
    pub async fn send(&self, addr: &str, directives: Vec<Directive>) -> Result<Accepted, HookError> {
        let req =
            self.request(reqwest::Method::POST, addr, DIRECTIVES_PATH)?.json(&DirectiveBatch { directives });
        self.call(addr, req).await
    }
}

/// One upstream's hook, as the target of directives about its requests.
#[derive(Clone)]
pub struct HookTarget {
    pub channel: HookChannel,
    /// The hook's `host:port`.
    pub addr: String,
    /// The request's span, parent of each directive's (`Span::none()` untraced).
    pub span: tracing::Span,
}

impl HookTarget {
    /// Sends `end_thinking` for `request_id` in the background (the relay never waits on
    /// the channel); a failure is logged, and the stream simply thinks on.
    pub fn end_thinking(&self, request_id: &str) {
        if let Some(entry) = self.channel.streams.as_ref().and_then(|s| s.get(request_id)) {
            entry.progress.set_ending(Ending::HookDirectiveSent);
        }
        self.send_in_background(request_id, Action::EndThinking);
    }

    /// Tells the hook the request is over, so a later request reusing its id (ids come
    /// from clients) does not inherit what this one was told.
    pub fn forget(&self, request_id: &str) {
        self.send_in_background(request_id, Action::Forget);
    }

    fn send_in_background(&self, request_id: &str, action: Action) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let (channel, addr) = (self.channel.clone(), self.addr.clone());
        let span = crate::telemetry::spans::directive_span(&self.span, action_name(&action), &addr);
        let directive = Directive { request_id: request_id.to_owned(), action };
        let send = async move {
            if let Err(e) = channel.send(&addr, vec![directive]).await {
                crate::telemetry::spans::fail(&tracing::Span::current(), "hook_unreachable");
                tracing::warn!(error = %e, "policy channel: directive not delivered");
            }
        };
        rt.spawn(tracing::Instrument::instrument(send, span));
    }
}

/// A directive's name in span names and attributes.
fn action_name(action: &Action) -> &'static str {
    match action {
        Action::Phase { .. } => "phase",
        Action::Priority { .. } => "priority",
        Action::ThinkBudget { .. } => "think_budget",
        Action::EndThinking => "end_thinking",
        Action::Forget => "forget",
    }
}

impl std::fmt::Debug for HookTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The channel holds the secret; show only where.
        f.debug_struct("HookTarget").field("addr", &self.addr).finish()
    }
}
