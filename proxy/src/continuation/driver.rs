//! Runs one continued stream: relays the first leg while the watch decides, cuts it at
//! an event boundary, sends the continuation and relays it spliced. A task feeds the
//! client's body through a small channel, so a client that goes away (the channel
//! closes) ends both legs at once, which cancels them in the engine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Map, Value};
use tokio::sync::{Notify, mpsc};

use super::legs::{ClientAsked, SoFar, second_leg_body};
use super::lines::{Lines, data_payload};
use super::splice::{Emit, Splicer};
use super::watch::{Cut, ThinkWatch};
use super::{Delimiters, Route};
use crate::error::ProxyError;
use crate::telemetry::Metrics;

type Sender = mpsc::Sender<Result<Bytes, ProxyError>>;

/// What woke the first leg's loop.
enum Next {
    Cut(Cut),
    Item(Option<reqwest::Result<Bytes>>),
}

/// Where the continuation goes: the upstream that served the first leg (whose prefix
/// cache holds the conversation).
pub struct Upstream {
    pub client: reqwest::Client,
    /// The route's full URL.
    pub url: String,
    /// Headers for the continuation: the first leg's, with its own request id.
    pub headers: HeaderMap,
    pub name: String,
    pub first_byte_timeout: Duration,
}

pub struct Continuation {
    pub upstream: Upstream,
    pub route: Route,
    pub delimiters: Delimiters,
    /// The first leg's request body.
    pub first_body: Map<String, Value>,
    pub asked: ClientAsked,
    pub watch: ThinkWatch,
    pub splicer: Splicer,
    /// Rung by the EAT prober when its signal says stop.
    pub end_now: Arc<Notify>,
    pub metrics: Arc<Metrics>,
    pub family: String,
}

impl Continuation {
    /// Starts relaying `first` (the first leg's body); returns the client's body.
    pub fn spawn(
        self,
        first: BoxStream<'static, reqwest::Result<Bytes>>,
    ) -> BoxStream<'static, Result<Bytes, ProxyError>> {
        let (tx, mut rx) = mpsc::channel(16);
        tokio::spawn(self.drive(first, tx));
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
    }

    async fn drive(mut self, mut first: BoxStream<'static, reqwest::Result<Bytes>>, tx: Sender) {
        let Some((cut, body)) = self.first_leg(&mut first, &tx).await else { return };
        // Dropping the first leg's response closes its connection: the engine aborts it.
        drop(first);
        self.count(cut);
        tracing::debug!(reason = cut.label(), upstream = %self.upstream.name, "thinking cut; continuing");
        if let Err(e) = self.second_leg(&body, &tx).await {
            let _ = tx.send(Err(e)).await;
        }
    }

    fn count(&self, cut: Cut) {
        self.metrics.count_continuation(cut.label());
        match cut {
            Cut::Tokens => {} // the relay's own tracker counts budgets reached
            Cut::Seconds => self.metrics.count_budget_reached(&self.family),
            Cut::Rpdi | Cut::Eat => self.metrics.count_entropy_exit(cut.label()),
        }
    }

    /// Relays the first leg until it ends (`None`) or a cut is due (the cut and the
    /// continuation's body).
    async fn first_leg(
        &mut self,
        first: &mut BoxStream<'static, reqwest::Result<Bytes>>,
        tx: &Sender,
    ) -> Option<(Cut, Value)> {
        let mut lines = Lines::default();
        // Whether the client holds an event without its closing blank line.
        let mut open_event = false;
        let mut skip_blank = false;
        let end_now = self.end_now.clone();
        loop {
            let deadline = self.watch.deadline();
            let timer = async move {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            let thinking = self.watch.thinking();
            let next = tokio::select! {
                biased;
                _ = tx.closed() => return None,
                _ = end_now.notified(), if thinking => Next::Cut(Cut::Eat),
                _ = timer => Next::Cut(Cut::Seconds),
                item = first.next() => Next::Item(item),
            };
            let chunk = match next {
                Next::Cut(c) => {
                    let Some(body) = self.plan(c) else { continue };
                    if open_event && tx.send(Ok(Bytes::from_static(b"\n"))).await.is_err() {
                        return None;
                    }
                    return Some((c, body));
                }
                Next::Item(None) => {
                    let rest = lines.take_partial();
                    if !rest.is_empty() {
                        // Half a line: the relay reports the stream as broken.
                        let _ = tx.send(Ok(rest)).await;
                    }
                    return None;
                }
                Next::Item(Some(Err(e))) => {
                    tracing::warn!(upstream = %self.upstream.name, error = %e, "upstream stream failed");
                    let _ = tx.send(Err(self.failed("the stream broke off"))).await;
                    return None;
                }
                Next::Item(Some(Ok(chunk))) => chunk,
            };
            let mut out = BytesMut::new();
            let mut cut = None;
            for line in lines.feed(&chunk) {
                let parsed = data_payload(&line).and_then(|p| serde_json::from_slice::<Value>(p).ok());
                let Some(mut v) = parsed else {
                    if !(line.is_empty() && std::mem::take(&mut skip_blank)) {
                        push_line(&mut out, &line);
                        open_event = !line.is_empty();
                    }
                    continue;
                };
                let due = self.watch.observe(&v, Instant::now());
                match self.splicer.first_leg(&mut v) {
                    Emit::Same => push_line(&mut out, &line),
                    Emit::Changed => push_json(&mut out, &v),
                    Emit::Drop => skip_blank = true,
                }
                open_event = !skip_blank;
                if let Some(planned) = due.and_then(|c| self.plan(c).map(|b| (c, b))) {
                    cut = Some(planned);
                    break;
                }
            }
            if cut.is_some() && open_event {
                out.extend_from_slice(b"\n");
            }
            if !out.is_empty() && tx.send(Ok(out.freeze())).await.is_err() {
                return None;
            }
            if cut.is_some() {
                return cut;
            }
        }
    }

    /// The continuation's body for a cut, or `None` (and no more cuts) when the request
    /// has no room left to answer in.
    fn plan(&mut self, cut: Cut) -> Option<Value> {
        let tokens = self.splicer.cut(self.watch.tokens());
        let so_far = SoFar { text: self.watch.text(), tokens };
        let body = second_leg_body(&self.first_body, self.route, &self.delimiters, so_far, self.asked);
        if body.is_none() {
            tracing::debug!(reason = cut.label(), "no room left to continue; thinking goes on");
            self.watch.settle();
        }
        body
    }

    async fn second_leg(&mut self, body: &Value, tx: &Sender) -> Result<(), ProxyError> {
        let up = &self.upstream;
        let send = up.client.post(&up.url).headers(up.headers.clone()).json(body).send();
        let resp = tokio::select! {
            _ = tx.closed() => return Ok(()),
            r = tokio::time::timeout(up.first_byte_timeout, send) => r,
        };
        let resp = match resp {
            Err(_) => {
                return Err(ProxyError::UpstreamTimeout {
                    upstream: up.name.clone(),
                    after_s: up.first_byte_timeout.as_secs_f64(),
                });
            }
            Ok(Err(e)) => return Err(self.failed(&format!("the continuation could not be sent: {e}"))),
            Ok(Ok(r)) => r,
        };
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            let text: String = text.chars().take(300).collect();
            return Err(self.failed(&format!("the continuation was refused ({status}): {text}")));
        }
        let streamed = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !streamed {
            return Err(self.failed("the continuation came back whole, not as an event stream"));
        }
        let mut stream = resp.bytes_stream();
        let mut lines = Lines::default();
        let mut skip_blank = false;
        loop {
            let item = tokio::select! {
                _ = tx.closed() => return Ok(()),
                item = stream.next() => item,
            };
            let chunk = match item {
                None => {
                    let rest = lines.take_partial();
                    if !rest.is_empty() {
                        let _ = tx.send(Ok(rest)).await;
                    }
                    return Ok(());
                }
                Some(Err(_)) => return Err(self.failed("the continuation broke off")),
                Some(Ok(c)) => c,
            };
            let mut out = BytesMut::new();
            for line in lines.feed(&chunk) {
                match data_payload(&line).and_then(|p| serde_json::from_slice::<Value>(p).ok()) {
                    Some(mut v) => match self.splicer.second_leg(&mut v) {
                        Emit::Same => push_line(&mut out, &line),
                        Emit::Changed => push_json(&mut out, &v),
                        Emit::Drop => skip_blank = true,
                    },
                    None if line.is_empty() && std::mem::take(&mut skip_blank) => {}
                    None => push_line(&mut out, &line),
                }
            }
            if !out.is_empty() && tx.send(Ok(out.freeze())).await.is_err() {
                return Ok(());
            }
        }
    }

    fn failed(&self, reason: &str) -> ProxyError {
        ProxyError::UpstreamFailed { upstream: self.upstream.name.clone(), reason: reason.to_owned() }
    }
}

fn push_line(out: &mut BytesMut, line: &[u8]) {
    out.extend_from_slice(line);
    out.extend_from_slice(b"\n");
}

fn push_json(out: &mut BytesMut, v: &Value) {
    out.extend_from_slice(b"data: ");
    // A Value always serialises.
    let _ = serde_json::to_writer(bytes::BufMut::writer(&mut *out), v);
    out.extend_from_slice(b"\n");
}
