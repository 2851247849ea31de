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
use super::splice::{Emit, Splicer};
use super::watch::{Cut, ThinkWatch};
use super::{Delimiters, Route};
use crate::error::ProxyError;
use crate::telemetry::{Metrics, spans};
use meridian_core::stream::{LineReader, SseLine, lines, sse_line};
use tracing::Instrument;

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
    /// The longest line taken from a leg (`upstream.max_response_bytes`).
    pub max_line: usize,
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
    /// The stream's entry in the open-stream registry, marked when thinking is cut.
    pub live: Option<Arc<crate::streams::StreamGuard>>,
    /// The request's span: each leg after the cut gets a span under it, whose context
    /// goes upstream (`Span::none()`: untraced, headers as they are).
    pub span: tracing::Span,
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
        if let Some(live) = &self.live {
            live.entry().set_ending(crate::streams::Ending::Continued);
        }
        tracing::debug!(reason = cut.label(), upstream = %self.upstream.name, "thinking cut; continuing");
        let leg = spans::leg_span(&self.span, cut.label(), &self.upstream.name);
        let sent = self.second_leg(&body, &tx, &leg).instrument(leg.clone()).await;
        if let Err(e) = sent {
            spans::fail(&leg, e.outcome());
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
        let mut reader = LineReader::new(self.upstream.max_line);
        let mut out = Output::default();
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
                    out.close_event();
                    if let Some(b) = out.take() {
                        tx.send(Ok(b)).await.ok()?;
                    }
                    return Some((c, body));
                }
                Next::Item(None) => {
                    let rest = reader.take_partial();
                    if !rest.is_empty() {
                        // Half a line: the relay reports the stream as broken.
                        let _ = tx.send(Ok(rest)).await;
                    }
                    return None;
                }
                Next::Item(Some(Err(e))) => {
                    tracing::warn!(parent: &self.span, upstream = %self.upstream.name, error = %e, "upstream stream failed");
                    let _ = tx.send(Err(self.failed("the stream broke off"))).await;
                    return None;
                }
                Next::Item(Some(Ok(chunk))) => chunk,
            };
            let block = match reader.push(&chunk) {
                Ok(Some(block)) => block,
                Ok(None) => continue,
                Err(e) => {
                    let _ =
                        tx.send(Err(self.failed(&format!("sent {e} (upstream.max_response_bytes)")))).await;
                    return None;
                }
            };
            let mut cut = None;
            for line in lines(&block) {
                let Some(payload) = payload_of(line) else {
                    out.other(line);
                    continue;
                };
                let due = self.watch.observe(payload, Instant::now());
                let emit = self.splicer.first_leg(payload);
                out.chunk(emit, line);
                if let Some(planned) = due.and_then(|c| self.plan(c).map(|b| (c, b))) {
                    out.close_event();
                    cut = Some(planned);
                    break;
                }
            }
            if let Some(b) = out.take() {
                tx.send(Ok(b)).await.ok()?;
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

    async fn second_leg(&mut self, body: &Value, tx: &Sender, leg: &tracing::Span) -> Result<(), ProxyError> {
        let up = &self.upstream;
        let mut headers = up.headers.clone();
        spans::inject(leg, &mut headers);
        let send = up.client.post(&up.url).headers(headers).json(body).send();
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
        leg.record("http.response.status_code", i64::from(resp.status().as_u16()));
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
        let mut reader = LineReader::new(self.upstream.max_line);
        let mut out = Output::default();
        loop {
            let item = tokio::select! {
                _ = tx.closed() => return Ok(()),
                item = stream.next() => item,
            };
            let chunk = match item {
                None => {
                    let rest = reader.take_partial();
                    if !rest.is_empty() {
                        let _ = tx.send(Ok(rest)).await;
                    }
                    return Ok(());
                }
                Some(Err(_)) => return Err(self.failed("the continuation broke off")),
                Some(Ok(c)) => c,
            };
            let block = match reader.push(&chunk) {
                Ok(Some(block)) => block,
                Ok(None) => continue,
                Err(e) => return Err(self.failed(&format!("sent {e} (upstream.max_response_bytes)"))),
            };
            for line in lines(&block) {
                match payload_of(line) {
                    Some(payload) => {
                        let emit = self.splicer.second_leg(payload);
                        out.chunk(emit, line);
                    }
                    None => out.other(line),
                }
            }
            if let Some(b) = out.take() {
                if tx.send(Ok(b)).await.is_err() {
                    return Ok(());
                }
            }
        }
    }

    fn failed(&self, reason: &str) -> ProxyError {
        ProxyError::UpstreamFailed { upstream: self.upstream.name.clone(), reason: reason.to_owned() }
    }
}

/// The chunk (JSON payload) of a `data:` line.
fn payload_of(line: &[u8]) -> Option<&[u8]> {
    match sse_line(line) {
        SseLine::Data(payload) => Some(payload),
        SseLine::Done | SseLine::Blank | SseLine::Other => None,
    }
}

/// What a leg's lines become for the client: chunks kept, rewritten or dropped (with the
/// blank line that ended a dropped one), other lines as they came.
#[derive(Default)]
struct Output {
    buf: BytesMut,
    skip_blank: bool,
    /// The client holds an event without its closing blank line.
    open_event: bool,
}

impl Output {
    /// A line that is not a chunk: a blank line, a comment, `[DONE]`.
    fn other(&mut self, line: &[u8]) {
        if line.is_empty() && std::mem::take(&mut self.skip_blank) {
            return;
        }
        self.push_line(line);
        self.open_event = !line.is_empty();
    }

    /// A chunk's `data:` line, as the splicer decided.
    fn chunk(&mut self, emit: Emit, line: &[u8]) {
        match emit {
            Emit::Same => self.push_line(line),
            Emit::Changed(chunk) => {
                self.buf.extend_from_slice(b"data: ");
                self.buf.extend_from_slice(&chunk);
                self.buf.extend_from_slice(b"\n");
            }
            Emit::Drop => {
                self.skip_blank = true;
                return;
            }
        }
        self.open_event = true;
    }

    /// Ends the event the client holds open (the stream is cut here).
    fn close_event(&mut self) {
        if std::mem::take(&mut self.open_event) {
            self.buf.extend_from_slice(b"\n");
        }
    }

    fn take(&mut self) -> Option<Bytes> {
        (!self.buf.is_empty()).then(|| self.buf.split().freeze())
    }

    fn push_line(&mut self, line: &[u8]) {
        self.buf.extend_from_slice(line);
        self.buf.extend_from_slice(b"\n");
    }
}
