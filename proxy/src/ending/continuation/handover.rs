//! Phase-boundary migration by re-prefill: a stream on a `think` upstream
//! (`upstream.endpoints[].role`) has its answer continued on an answer upstream when its
//! thought ends, by itself, by a budget or by an exit signal. The continuation's second
//! leg goes there instead of back to the first leg's upstream: the answer upstream
//! prefills the prompt and the thought again (its own prefix cache may hold the prompt),
//! and the think upstream's place is free the moment the first leg is dropped.
//!
//! An answer moves only to an upstream with room (admission's limits, when on): with
//! none, it stays where it is, which is always possible, since the think upstream holds
//! its KV. With `admission.places = "engine"` the answer upstream's engine must grant it
//! a place as well, as for any request sent there: the first leg goes on while the claim
//! is out (the relay's poll does not wait on a round trip), and the answer moves once the
//! place is granted, carrying what the first leg sent meanwhile; refused, it stays.
//!
//! With `upstream.handover = "connector"` the KV goes across instead of being computed
//! again ([`KvExport`]): vLLM's prefill/decode protocol, with the think upstream as the
//! prefill side. The answer's prompt goes first to the think upstream, with `max_tokens:
//! 1` and `kv_transfer_params` asking it to export (its prefix cache holds the prompt and
//! the thought, so it computes only the few tokens after them; its connector saves or
//! offers the KV); what it answers in `kv_transfer_params` (where the blocks are, for
//! NIXL; nothing, for a shared-storage connector, whose store is keyed by the tokens)
//! goes with the answer's own request.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderValue;
use serde_json::{Value, json};

use super::ContinuationUpstream;
use crate::admission::Admission;
use crate::ctx::RequestCtx;
use crate::request_id::REQUEST_ID;
use crate::telemetry::Metrics;
use crate::upstream::{InFlight, Upstream, UpstreamPool};

/// A hand-over's claim of a place at the answer upstream's engine, in flight.
pub type PlaceClaim = Pin<Box<dyn Future<Output = Option<InFlight>> + Send>>;

/// Where a stream's answer may move to, and how it gets there.
pub struct HandOver {
    pub pool: Arc<UpstreamPool>,
    pub admission: Arc<Admission>,
    pub metrics: Arc<Metrics>,
    /// The `think` upstream the first leg runs on.
    pub from: Arc<Upstream>,
    /// The route's path (and query), for the answer upstream's URL.
    pub path: String,
    /// The KV goes across through vLLM's KV connector (`upstream.handover`).
    pub connector: bool,
}

impl HandOver {
    /// The answer upstream for `ctx`'s answer, counted in flight there; `None` when no
    /// answer upstream serving its model has room (the answer stays).
    pub fn pick(&self, ctx: &RequestCtx) -> Option<InFlight> {
        let room = |u: &Upstream| self.admission.has_room(u);
        let affinity = ctx.affinity_key.as_deref();
        self.pool.hand_over(&ctx.model, affinity, &self.from, &self.metrics, room)
    }

    /// Whether the answer may go to `to`'s upstream only once its engine grants it a
    /// place (`admission.places = "engine"`): the claim's round trip is not waited on in
    /// the relay's poll, so the cut waits for it ([`claim`](Self::claim)).
    pub fn needs_place(&self, to: &InFlight) -> bool {
        self.admission.needs_place(to.upstream())
    }

    /// `to`, for an answer sent there without a claim: where the engine grants places
    /// (this replica decides its room alone for now), holding one taken alone, so the
    /// engine counts the answer once its hook answers again.
    pub fn unclaimed(&self, to: InFlight) -> InFlight {
        self.admission.unclaimed(to)
    }

    /// Claims the answer's place at `to`'s engine: `to`, holding it, or `None` when the
    /// engine refused (the answer then stays, or a cut thought goes on where it was).
    pub fn claim(&self, to: InFlight, ctx: &RequestCtx) -> PlaceClaim {
        let (admission, class) = (Arc::clone(&self.admission), ctx.class);
        Box::pin(async move { admission.place_for_handover(to, class).await })
    }

    /// The export that precedes a hand-over's answer, when the KV goes across by
    /// connector: sent where the first leg went (`first`, the think upstream).
    pub fn export(&self, first: &ContinuationUpstream, ctx: &RequestCtx) -> Option<KvExport> {
        if !self.connector {
            return None;
        }
        let mut to = first.clone();
        if let Ok(id) = HeaderValue::from_str(&format!("{}-kv-export", ctx.request_id())) {
            to.headers.insert(REQUEST_ID, id);
        }
        Some(KvExport { to, metrics: self.metrics.clone() })
    }

    /// The continuation's target on `to`: the first leg's headers and client, `to`'s URL.
    pub fn target(&self, first: &ContinuationUpstream, to: &Upstream) -> ContinuationUpstream {
        ContinuationUpstream {
            url: format!("{}{}", to.base_url, self.path),
            name: to.name.clone(),
            ..first.clone()
        }
    }
}

/// The think upstream's export of a handed-over answer's KV, through vLLM's KV connector.
pub struct KvExport {
    /// The think upstream, at the route's path.
    to: ContinuationUpstream,
    metrics: Arc<Metrics>,
}

impl KvExport {
    /// Asks the think upstream to export the KV of `answer`'s prompt (the answer's own
    /// request body), and returns what the answer upstream must be told
    /// (`kv_transfer_params`, `Null` when the connector needs nothing). `None`: the export
    /// failed, and the answer upstream computes it all itself. Counted either way.
    pub async fn run(&self, answer: &Value) -> Option<Value> {
        let done = self.send(answer).await;
        self.metrics.count_kv_export(done.is_ok());
        match done {
            Ok(params) => Some(params),
            Err(reason) => {
                tracing::warn!(upstream = %self.to.name, %reason, "the KV export failed; the answer upstream prefills it again");
                None
            }
        }
    }

    async fn send(&self, answer: &Value) -> Result<Value, String> {
        let body = export_body(answer);
        let send = self.to.client.post(&self.to.url).headers(self.to.headers.clone()).json(&body).send();
        let wait = self.to.first_byte_timeout.min(Duration::from_secs(60));
        let resp = tokio::time::timeout(wait, send)
            .await
            .map_err(|_| format!("no answer in {} s", wait.as_secs_f64()))?
            .map_err(|e| format!("not sent: {e}"))?;
        let status = resp.status();
        let text = tokio::time::timeout(wait, resp.text())
            .await
            .map_err(|_| "its body did not arrive in time".to_owned())?
            .map_err(|e| format!("its body broke off: {e}"))?;
        if !status.is_success() {
            return Err(format!("refused ({status}): {}", text.chars().take(300).collect::<String>()));
        }
        let answered: Value = serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))?;
        Ok(answered.get("kv_transfer_params").cloned().unwrap_or(Value::Null))
    }
}

/// The export request: the answer's request, not streamed, one token, asking the engine
/// to keep its KV for a remote decode (vLLM's prefill/decode fields).
pub fn export_body(answer: &Value) -> Value {
    let mut body = answer.clone();
    if let Some(b) = body.as_object_mut() {
        for key in ["stream_options", "logprobs", "top_logprobs", "min_tokens", "max_completion_tokens"] {
            b.remove(key);
        }
        b.insert("stream".into(), false.into());
        b.insert("max_tokens".into(), 1.into());
        b.insert(
            "kv_transfer_params".into(),
            json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
                "remote_block_ids": null, "remote_host": null, "remote_port": null}),
        );
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;

    /// An export to a server that answers every request with `status` and `body`.
    async fn export_to(status: u16, body: &'static str) -> (KvExport, Arc<Metrics>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .fallback(move || async move { (axum::http::StatusCode::from_u16(status).unwrap(), body) });
        tokio::spawn(async move { axum::serve(listener, app).await });
        let metrics = Arc::new(Metrics::new());
        let to = ContinuationUpstream {
            client: reqwest::Client::new(),
            url: format!("http://{addr}/v1/chat/completions"),
            headers: HeaderMap::new(),
            name: "think".into(),
            first_byte_timeout: Duration::from_secs(5),
        };
        (KvExport { to, metrics: metrics.clone() }, metrics)
    }

    fn exports(m: &Metrics, outcome: &str) -> String {
        let line = format!("meridian_handover_kv_exports_total{{outcome=\"{outcome}\"}} ");
        m.render().lines().find_map(|l| l.strip_prefix(line.as_str()).map(str::to_owned)).unwrap_or_default()
    }

    #[tokio::test]
    async fn an_export_hands_on_what_the_think_engine_answered_and_a_failed_one_falls_back() {
        let (x, m) =
            export_to(200, r#"{"choices": [], "kv_transfer_params": {"remote_engine_id": "e1"}}"#).await;
        assert_eq!(x.run(&json!({"model": "m"})).await, Some(json!({"remote_engine_id": "e1"})));
        let (x, _) = export_to(200, r#"{"choices": []}"#).await;
        assert_eq!(
            x.run(&json!({"model": "m"})).await,
            Some(Value::Null),
            "a store keyed by tokens says nothing"
        );
        assert_eq!(exports(&m, "ok"), "1");
        let (x, m) = export_to(400, r#"{"error": {"message": "no connector"}}"#).await;
        assert_eq!(x.run(&json!({"model": "m"})).await, None, "refused: the answer engine prefills it all");
        let (y, _) = export_to(200, "not json").await;
        assert_eq!(y.run(&json!({"model": "m"})).await, None);
        assert_eq!((exports(&m, "failed"), exports(&m, "ok")), ("1".into(), "0".into()));
    }

    #[test]
    fn the_export_is_the_answers_prompt_for_one_token_unstreamed_asking_to_export() {
        let answer = json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
            "max_completion_tokens": 90, "min_tokens": 3, "logprobs": true, "top_logprobs": 5,
            "continue_final_message": true, "messages": [{"role": "assistant", "content": "<think>\nx\n</think>\n\n"}]});
        let export = export_body(&answer);
        assert_eq!(export["messages"], answer["messages"], "the same prompt, so the same tokens");
        assert_eq!(export["continue_final_message"], true);
        assert_eq!((export["stream"].clone(), export["max_tokens"].clone()), (json!(false), json!(1)));
        for gone in ["stream_options", "max_completion_tokens", "min_tokens", "logprobs", "top_logprobs"] {
            assert!(export.get(gone).is_none(), "{gone}");
        }
        assert_eq!(export["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(export["kv_transfer_params"]["do_remote_prefill"], false);
    }
}
