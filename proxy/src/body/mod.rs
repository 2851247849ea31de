//! A generation request's body: read (within the server's limits), checked and parsed
//! once ([`GenerationRequest`]), and rewritten for what goes upstream
//! ([`upstream_body`], [`hook_body`]) without parsing it again. Apart from the routes
//! that read bodies and the ending of thinking that shapes what is sent, so that both
//! use it without depending on each other.

mod fields;

use std::borrow::Cow;
use std::time::Duration;

use crate::config::ServerConfig;
use axum::body::Body;
use bytes::Bytes;
use meridian_core::Phase;
use meridian_core::stream::Dialect;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::ProxyError;
use crate::members::{Edit, Members};

/// Reads the whole body: no more than `server.max_body_bytes` (the body-limit layer,
/// `crate::body_limit`, refuses a larger one, declared or as it arrives; this answers the
/// read it failed), and not still arriving after `server.request_body_timeout_s` (a
/// stalled or slow-drip upload would hold its connection and memory for as long as the
/// client liked).
pub async fn read_body(body: Body, server: &ServerConfig) -> Result<Bytes, ProxyError> {
    let limit = server.max_body_bytes;
    let timeout = Duration::from_secs_f64(server.request_body_timeout_s);
    let read = tokio::time::timeout(timeout, axum::body::to_bytes(body, usize::MAX))
        .await
        .map_err(|_| ProxyError::RequestTimeout { after_s: server.request_body_timeout_s })?;
    read.map_err(|e| {
        if caused_by_length_limit(&e) {
            ProxyError::PayloadTooLarge { limit }
        } else {
            ProxyError::bad_request(format!("could not read the request body: {e}"), None, "invalid_body")
        }
    })
}

fn caused_by_length_limit(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The fields the proxy reads, by name. Each must come at most once: with two values,
/// the proxy and the engine could act on different ones.
const READ_FIELDS: [&str; 14] = [
    "model",
    // How the response is relayed is decided by its content type; `stream` says only
    // whether a slow answer may get its headers early, with heartbeats.
    "stream",
    "chat_template_kwargs",
    "thinking_token_budget",
    // vLLM's own per-request priority, if the client set one.
    "priority",
    "max_tokens",
    "max_completion_tokens",
    "messages",
    "prompt",
    // The Responses API's prompt, token limit and reasoning effort.
    "input",
    "max_output_tokens",
    "reasoning",
    // The Messages API's thinking switch and budget.
    "thinking",
    // Meridian's own extension fields; removed before the request goes upstream.
    "meridian",
];

/// `"meridian": {...}` in a request body.
#[derive(Deserialize, Debug, Clone, Copy, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MeridianExtension {
    /// End thinking after this many tokens.
    #[serde(default)]
    pub think_budget_tokens: Option<u32>,
    /// End thinking after this many seconds of it (through the upstream's hook).
    #[serde(default)]
    pub think_budget_s: Option<f64>,
    /// Admission class the client asks for (`"interactive"`, the default, or `"batch"`).
    #[serde(default)]
    pub class: Option<ClientClass>,
}

/// The admission classes a client may choose.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ClientClass {
    Interactive,
    Batch,
}

#[derive(Deserialize)]
struct TemplateKwargs {
    #[serde(default)]
    enable_thinking: Option<bool>,
}

/// The Responses API's `reasoning`: `{"effort": "none" | "low" | ...}`.
#[derive(Deserialize)]
struct ReasoningConfig<'a> {
    #[serde(borrow, default)]
    effort: Option<Cow<'a, str>>,
}

/// The Messages API's `thinking`: `{"type": "enabled", "budget_tokens": N}`,
/// `{"type": "disabled"}` or `{"type": "adaptive"}`.
#[derive(Deserialize)]
struct ThinkingConfig<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(default)]
    budget_tokens: Option<u32>,
}

/// What the proxy needs to know about a generation request, from one parse of its body.
#[derive(Debug)]
pub struct GenerationRequest<'a> {
    /// The body's members, for rewriting it (see [`Members`]).
    members: Members<'a>,
    /// The API it is written in.
    pub dialect: Dialect,
    pub model: Cow<'a, str>,
    /// Set when the request turned thinking off (`chat_template_kwargs.enable_thinking`).
    pub initial_phase: Option<Phase>,
    /// The client's own think budget: `thinking_token_budget` (chat, completions), or
    /// `thinking.budget_tokens` (Messages), which vLLM enforces itself.
    pub client_budget: Option<u32>,
    /// The client set vLLM's `priority` field itself.
    pub client_priority: bool,
    pub extension: Option<MeridianExtension>,
    /// The client asked for a streamed answer (`"stream": true`).
    pub stream: bool,
}

impl<'a> GenerationRequest<'a> {
    /// Parses a body of the given API; the fields each API names are checked as it
    /// defines them, and another API's fields are left to the engine.
    pub fn parse(body: &'a [u8], dialect: Dialect) -> Result<Self, ProxyError> {
        // serde_json skips the values of fields it does not read without checking their
        // UTF-8, and those bytes go upstream verbatim: check the whole body first.
        if let Err(e) = std::str::from_utf8(body) {
            return Err(ProxyError::bad_request(
                format!("request body is not valid UTF-8 (invalid byte at offset {})", e.valid_up_to()),
                None,
                "invalid_json",
            ));
        }
        if fields::nests_deeper_than(body, fields::MAX_NESTING) {
            return Err(ProxyError::bad_request(
                format!("request body nests arrays and objects more than {} deep", fields::MAX_NESTING),
                None,
                "invalid_json",
            ));
        }
        // serde would also read a struct from a JSON array, positionally.
        if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
            return Err(ProxyError::bad_request("request body must be a JSON object", None, "invalid_json"));
        }
        let members: Members<'a> = serde_json::from_slice(body).map_err(|e| {
            let message = if e.is_syntax() || e.is_eof() {
                format!("request body is not valid JSON: {e}")
            } else {
                format!("request body must be a JSON object with the OpenAI request fields: {e}")
            };
            ProxyError::bad_request(message, None, "invalid_json")
        })?;
        let mut read: [Option<&'a RawValue>; READ_FIELDS.len()] = [None; READ_FIELDS.len()];
        for (slot, name) in read.iter_mut().zip(READ_FIELDS) {
            let mut values = members.all(name);
            *slot = values.next();
            if values.next().is_some() {
                return Err(ProxyError::bad_request(
                    format!(
                        "request body must be a JSON object with the OpenAI request fields: duplicate field `{name}`"
                    ),
                    Some(name),
                    "invalid_json",
                ));
            }
        }
        let [
            model,
            stream,
            chat_template_kwargs,
            thinking_token_budget,
            priority,
            max_tokens,
            max_completion_tokens,
            messages,
            prompt,
            input,
            max_output_tokens,
            reasoning,
            thinking,
            meridian,
        ] = read;
        // `null` is absent, as OpenAI's API treats it.
        let raw = model.filter(|m| m.get() != "null").ok_or_else(|| {
            ProxyError::bad_request("you must provide a model parameter", Some("model"), "missing_model")
        })?;
        let model: Cow<'a, str> = serde_json::from_str(raw.get())
            .map_err(|_| ProxyError::bad_request("model must be a string", Some("model"), "invalid_model"))?;
        if model.is_empty() {
            return Err(ProxyError::bad_request("model must not be empty", Some("model"), "invalid_model"));
        }
        let stream: Option<bool> = fields::typed(stream, "stream", "a boolean")?;
        let kwargs: Option<TemplateKwargs> = fields::typed(
            chat_template_kwargs,
            "chat_template_kwargs",
            "an object with a boolean enable_thinking",
        )?;
        let priority: Option<i64> = fields::typed(priority, "priority", "an integer")?;
        let mut client_budget: Option<u32> = None;
        let kwargs_thinking = kwargs.and_then(|k| k.enable_thinking);
        let mut thinking_off = kwargs_thinking == Some(false);
        match dialect {
            Dialect::Chat => {
                client_budget =
                    fields::typed(thinking_token_budget, "thinking_token_budget", "a non-negative integer")?;
                fields::token_limit(max_tokens, "max_tokens")?;
                fields::token_limit(max_completion_tokens, "max_completion_tokens")?;
                fields::shaped(messages, "messages", "an array of messages", |c| c == b'[')?;
                fields::shaped(prompt, "prompt", "a string or an array", |c| c == b'"' || c == b'[')?;
            }
            Dialect::Responses => {
                fields::token_limit(max_output_tokens, "max_output_tokens")?;
                fields::shaped(input, "input", "a string or an array", |c| c == b'"' || c == b'[')?;
                let reasoning: Option<ReasoningConfig<'_>> =
                    fields::typed(reasoning, "reasoning", "an object with an effort")?;
                // vLLM switches thinking off for effort "none", unless the client's own
                // template arguments say otherwise.
                let effort_none = reasoning.and_then(|r| r.effort).is_some_and(|e| e == "none");
                if effort_none && kwargs_thinking.is_none() {
                    thinking_off = true;
                }
            }
            Dialect::Messages => {
                fields::token_limit(max_tokens, "max_tokens")?;
                fields::shaped(messages, "messages", "an array of messages", |c| c == b'[')?;
                let thinking: Option<ThinkingConfig<'_>> = fields::typed(
                    thinking,
                    "thinking",
                    "an object with a type (enabled, disabled or adaptive)",
                )?;
                if let Some(t) = thinking {
                    thinking_off |= t.kind == "disabled";
                    client_budget = t.budget_tokens.filter(|_| t.kind == "enabled");
                }
            }
        }
        let extension = fields::extension(meridian)?;
        if extension.and_then(|m| m.think_budget_s).is_some_and(|s| !(s.is_finite() && s > 0.0)) {
            return Err(ProxyError::bad_request(
                "meridian.think_budget_s must be a positive number of seconds",
                Some("meridian.think_budget_s"),
                "invalid_budget",
            ));
        }
        if extension.and_then(|m| m.think_budget_tokens) == Some(0) {
            return Err(ProxyError::bad_request(
                "meridian.think_budget_tokens must be at least 1",
                Some("meridian.think_budget_tokens"),
                "invalid_budget",
            ));
        }
        Ok(GenerationRequest {
            members,
            dialect,
            model,
            initial_phase: thinking_off.then_some(Phase::Output),
            client_budget,
            client_priority: priority.is_some(),
            extension,
            stream: stream == Some(true),
        })
    }
}

impl GenerationRequest<'_> {
    /// Whether the continuation can take this request: streamed, one choice, and the
    /// prompt in the shape it appends to (chat: `messages`, an array; completions: a
    /// single text `prompt`). Read from the members, without parsing the body again.
    pub fn continuable(&self, chat: bool) -> bool {
        let starts_with = |field: &str, b: u8| {
            self.members.all(field).last().is_some_and(|v| v.get().starts_with(b as char))
        };
        let n = self.members.all("n").last().and_then(|v| serde_json::from_str::<u64>(v.get()).ok());
        let shape = if chat { starts_with("messages", b'[') } else { starts_with("prompt", b'"') };
        self.stream && n.is_none_or(|n| n == 1) && shape
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(body: &str) -> String {
        match GenerationRequest::parse(body.as_bytes(), Dialect::Chat) {
            Err(ProxyError::BadRequest { code, .. }) => code.to_owned(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn rejects_bad_input_with_specific_codes() {
        assert_eq!(code("{"), "invalid_json");
        assert_eq!(code("[]"), "invalid_json");
        assert_eq!(code(r#"{"messages":[]}"#), "missing_model");
        assert_eq!(code(r#"{"model":null,"messages":[]}"#), "missing_model", "null is absent");
        assert_eq!(code(r#"{"model":7}"#), "invalid_model");
        assert_eq!(code(r#"{"model":""}"#), "invalid_model");
        assert_eq!(code(r#"{"model":"m","stream":"yes"}"#), "invalid_type");
        // Invalid UTF-8 in a field the proxy never reads would otherwise go upstream.
        let not_utf8 = b"{\"model\":\"m\",\"messages\":[{\"ro\xe9le\":\"user\"}]}";
        assert!(matches!(
            GenerationRequest::parse(not_utf8, Dialect::Chat),
            Err(ProxyError::BadRequest { code: "invalid_json", .. })
        ));
    }

    #[test]
    fn extension_is_validated_and_stripped() {
        assert_eq!(code(r#"{"model":"m","meridian":{"think_budget":3}}"#), "invalid_json");
        assert_eq!(code(r#"{"model":"m","meridian":{"think_budget_tokens":0}}"#), "invalid_budget");
        let body = Bytes::from_static(br#"{"model":"m","z":1,"meridian":{"think_budget_tokens":7},"a":[1]}"#);
        let r = GenerationRequest::parse(&body, Dialect::Chat).unwrap();
        let out = upstream_body(&body, &r, Some(7), false).unwrap();
        assert_eq!(&out[..], br#"{"model":"m","z":1,"a":[1],"thinking_token_budget":7}"#, "order kept");
        let plain = Bytes::from_static(br#"{"model":"m","thinking_token_budget":5}"#);
        let r = GenerationRequest::parse(&plain, Dialect::Chat).unwrap();
        assert_eq!(
            upstream_body(&plain, &r, Some(5), false).unwrap(),
            plain,
            "untouched when nothing changes"
        );
    }

    #[test]
    fn reads_model_stream_and_thinking_switch() {
        let r = GenerationRequest::parse(
            br#"{"model":"a\"b","stream":true,"x":{"y":1},"chat_template_kwargs":{"enable_thinking":false}}"#,
            Dialect::Chat,
        )
        .unwrap();
        assert_eq!(r.model, "a\"b");
        assert_eq!(r.initial_phase, Some(Phase::Output));
    }

    #[test]
    fn only_one_streamed_choice_in_the_continued_shape_is_continuable() {
        let continuable = |body: &str, chat: bool| {
            GenerationRequest::parse(body.as_bytes(), Dialect::Chat).unwrap().continuable(chat)
        };
        assert!(continuable(r#"{"model":"m","stream":true,"messages":[]}"#, true));
        assert!(continuable(r#"{"model":"m","stream":true,"n":1,"messages":[]}"#, true));
        assert!(!continuable(r#"{"model":"m","stream":true,"n":2,"messages":[]}"#, true));
        assert!(!continuable(r#"{"model":"m","messages":[]}"#, true), "not streamed");
        assert!(continuable(r#"{"model":"m","stream":true,"prompt":"a"}"#, false));
        assert!(!continuable(r#"{"model":"m","stream":true,"prompt":["a","b"]}"#, false));
        assert!(!continuable(r#"{"model":"m","stream":true,"prompt":"a"}"#, true), "chat needs messages");
    }

    #[test]
    fn each_api_is_checked_by_its_own_fields() {
        fn parse(body: &str, dialect: Dialect) -> Result<GenerationRequest<'_>, ProxyError> {
            GenerationRequest::parse(body.as_bytes(), dialect)
        }
        let code = |body: &str, dialect| match parse(body, dialect) {
            Err(ProxyError::BadRequest { param, code, .. }) => (param, code),
            other => panic!("{other:?}"),
        };
        // Responses: `input` and `max_output_tokens`; a chat-only field is the engine's.
        assert_eq!(code(r#"{"model":"m","input":5}"#, Dialect::Responses), (Some("input"), "invalid_type"));
        assert_eq!(
            code(r#"{"model":"m","input":"hi","max_output_tokens":0}"#, Dialect::Responses),
            (Some("max_output_tokens"), "invalid_value")
        );
        let r = parse(r#"{"model":"m","input":[],"thinking_token_budget":9}"#, Dialect::Responses).unwrap();
        assert_eq!(r.client_budget, None, "vLLM reads no budget field on the Responses API");
        let r =
            parse(r#"{"model":"m","input":"x","reasoning":{"effort":"none"}}"#, Dialect::Responses).unwrap();
        assert_eq!(r.initial_phase, Some(Phase::Output), "effort none switches thinking off");
        let r = parse(
            r#"{"model":"m","input":"x","reasoning":{"effort":"none"},"chat_template_kwargs":{"enable_thinking":true}}"#,
            Dialect::Responses,
        )
        .unwrap();
        assert_eq!(r.initial_phase, None, "unless the template arguments turn it on");
        let r =
            parse(r#"{"model":"m","input":"x","reasoning":{"effort":"high"}}"#, Dialect::Responses).unwrap();
        assert_eq!(r.initial_phase, None);
        // Messages: its `thinking` object switches thinking off or sets the budget.
        let r = parse(r#"{"model":"m","messages":[],"thinking":{"type":"disabled"}}"#, Dialect::Messages)
            .unwrap();
        assert_eq!((r.initial_phase, r.client_budget), (Some(Phase::Output), None));
        let r = parse(
            r#"{"model":"m","messages":[],"thinking":{"type":"enabled","budget_tokens":2048}}"#,
            Dialect::Messages,
        )
        .unwrap();
        assert_eq!((r.initial_phase, r.client_budget), (None, Some(2048)));
        assert_eq!(
            code(r#"{"model":"m","messages":[],"thinking":"on"}"#, Dialect::Messages),
            (Some("thinking"), "invalid_type")
        );
        assert_eq!(
            code(r#"{"model":"m","messages":{},"max_tokens":8}"#, Dialect::Messages),
            (Some("messages"), "invalid_type")
        );
    }

    #[test]
    fn a_budget_goes_in_the_body_only_where_the_engine_reads_one() {
        for (body, dialect) in [
            (r#"{"model":"m","input":"hi"}"#, Dialect::Responses),
            (r#"{"model":"m","messages":[],"max_tokens":8}"#, Dialect::Messages),
        ] {
            let body = Bytes::from(body);
            let r = GenerationRequest::parse(&body, dialect).unwrap();
            assert_eq!(upstream_body(&body, &r, Some(64), false).unwrap(), body, "{dialect:?}");
            let hooked: serde_json::Value =
                serde_json::from_slice(&hook_body(&body, &r, Some(64), "s-1", false, None).unwrap()).unwrap();
            assert_eq!(hooked["vllm_xargs"]["meridian_think_budget"], 64, "{dialect:?}: through the hook");
        }
    }

    #[test]
    fn class_is_read_from_the_extension() {
        let r = GenerationRequest::parse(br#"{"model":"m","meridian":{"class":"batch"}}"#, Dialect::Chat)
            .unwrap();
        assert_eq!(r.extension.and_then(|e| e.class), Some(ClientClass::Batch));
        assert_eq!(code(r#"{"model":"m","meridian":{"class":"output"}}"#), "invalid_json");
        let Err(ProxyError::BadRequest { message, .. }) =
            GenerationRequest::parse(br#"{"model":"m","meridian":{"class":"urgent"}}"#, Dialect::Chat)
        else {
            panic!("accepted")
        };
        assert!(message.starts_with("bad meridian extension"), "{message}");
    }
}

/// The body to send upstream: without Meridian's extension object, with
/// `thinking_token_budget` set when Meridian applies a budget, and without the client's
/// `priority` when `drop_priority` (its tenant may not set one). Unchanged bytes when
/// there is nothing to change.
pub fn upstream_body(
    body: &Bytes,
    req: &GenerationRequest<'_>,
    budget: Option<u32>,
    drop_priority: bool,
) -> Result<Bytes, ProxyError> {
    // Only chat and completions take a token budget field for any size (the Messages
    // API's `thinking.budget_tokens` must be at least 1,024); the others get budgets
    // through the hook.
    let set_budget = budget.filter(|b| req.client_budget != Some(*b) && req.dialect == Dialect::Chat);
    let drop_priority = drop_priority && req.members.contains("priority");
    if !req.members.contains("meridian") && set_budget.is_none() && !drop_priority {
        return Ok(body.clone());
    }
    let budget_text = set_budget.map(|b| b.to_string());
    let mut edits = vec![("meridian", Edit::Remove)];
    if drop_priority {
        edits.push(("priority", Edit::Remove));
    }
    if let Some(b) = &budget_text {
        edits.push(("thinking_token_budget", Edit::Set(b.as_str().into())));
    }
    Ok(Bytes::from(req.members.rewrite(&edits, body.len())))
}

/// The `vllm_xargs` entry that tells the hook how long a request waited in the proxy's
/// admission queue, in milliseconds (`meridian_hook.vllm_adapter.QUEUED_ARG`).
pub const QUEUED_ARG: &str = "meridian_queued_ms";

/// The body for an upstream whose Meridian hook is ready: without Meridian's extension,
/// and with the request id and think budget in `vllm_xargs`, which vLLM hands the hook's
/// logits processor as `SamplingParams.extra_args`. The hook then enforces the budget
/// and can be told to end thinking by request id. A client's own
/// `thinking_token_budget` stays (vLLM applies it after the hook); the hook gets the
/// budget too when it is smaller (a tenant's ceiling). Without the client's `priority`
/// when `drop_priority`. `queued`: how long the request waited in the proxy's admission
/// queue (`meridian_queued_ms`), which the hook's start target counts as waiting to start.
pub fn hook_body(
    body: &Bytes,
    req: &GenerationRequest<'_>,
    budget: Option<u32>,
    request_id: &str,
    drop_priority: bool,
    queued: Option<std::time::Duration>,
) -> Result<Bytes, ProxyError> {
    let invalid = |msg: String| ProxyError::bad_request(msg, Some("vllm_xargs"), "invalid_json");
    // The client's own `vllm_xargs` (small) is the one value parsed again, to add to it.
    // Sent twice, the last one counts (as for the engine's JSON parser).
    let mut xargs = serde_json::Map::new();
    if let Some(raw) = req.members.all("vllm_xargs").last() {
        match serde_json::from_str::<serde_json::Value>(raw.get()) {
            Ok(serde_json::Value::Object(own)) => xargs = own,
            _ => return Err(invalid("vllm_xargs must be an object".into())),
        }
    }
    xargs.insert("meridian_request_id".into(), request_id.into());
    if let Some(b) = budget.filter(|b| req.client_budget.is_none_or(|own| *b < own)) {
        xargs.insert("meridian_think_budget".into(), b.into());
    }
    // Only the proxy says how long a request waited in its queue: a client's own figure
    // would lift the hook's limits for every stream on the engine.
    xargs.remove(QUEUED_ARG);
    if let Some(ms) = queued.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).filter(|&ms| ms > 0) {
        xargs.insert(QUEUED_ARG.into(), ms.into());
    }
    let xargs =
        serde_json::to_string(&xargs).map_err(|e| invalid(format!("cannot re-encode vllm_xargs: {e}")))?;
    let mut edits = vec![("meridian", Edit::Remove), ("vllm_xargs", Edit::Set(xargs.into()))];
    if drop_priority && req.members.contains("priority") {
        edits.push(("priority", Edit::Remove));
    }
    Ok(Bytes::from(req.members.rewrite(&edits, body.len())))
}

#[cfg(test)]
mod hook_body_tests {
    use super::*;

    #[test]
    fn request_id_and_budget_travel_in_vllm_xargs() {
        let body = Bytes::from_static(
            br#"{"model":"m","meridian":{"think_budget_tokens":7},"vllm_xargs":{"own":1}}"#,
        );
        let req = GenerationRequest::parse(&body, Dialect::Chat).unwrap();
        let out = hook_body(&body, &req, Some(7), "req-1", false, None).unwrap();
        assert_eq!(
            &out[..],
            br#"{"model":"m","vllm_xargs":{"own":1,"meridian_request_id":"req-1","meridian_think_budget":7}}"#
        );
    }

    #[test]
    fn a_priority_the_tenant_may_not_set_is_dropped_and_a_smaller_budget_reaches_the_hook() {
        let body = Bytes::from_static(br#"{"model":"m","priority":-5,"thinking_token_budget":900}"#);
        let req = GenerationRequest::parse(&body, Dialect::Chat).unwrap();
        let out = hook_body(&body, &req, Some(300), "r", true, None).unwrap();
        assert_eq!(
            &out[..],
            br#"{"model":"m","thinking_token_budget":900,"vllm_xargs":{"meridian_request_id":"r","meridian_think_budget":300}}"#
        );
        let out = upstream_body(&body, &req, Some(300), true).unwrap();
        assert_eq!(&out[..], br#"{"model":"m","thinking_token_budget":300}"#);
        assert_eq!(upstream_body(&body, &req, Some(900), false).unwrap(), body, "allowed: untouched");
    }

    #[test]
    fn the_wait_in_the_admission_queue_reaches_the_hook_and_only_the_proxy_says_it() {
        let body = Bytes::from_static(br#"{"model":"m","vllm_xargs":{"meridian_queued_ms":99999}}"#);
        let req = GenerationRequest::parse(&body, Dialect::Chat).unwrap();
        let waited = std::time::Duration::from_millis(2500);
        let out: serde_json::Value =
            serde_json::from_slice(&hook_body(&body, &req, None, "r", false, Some(waited)).unwrap()).unwrap();
        assert_eq!(
            out["vllm_xargs"],
            serde_json::json!({"meridian_request_id": "r", "meridian_queued_ms": 2500})
        );
        let out: serde_json::Value =
            serde_json::from_slice(&hook_body(&body, &req, None, "r", false, None).unwrap()).unwrap();
        assert_eq!(
            out["vllm_xargs"],
            serde_json::json!({"meridian_request_id": "r"}),
            "a client's own is dropped"
        );
    }

    #[test]
    fn client_budget_is_left_to_vllm_and_bad_xargs_are_refused() {
        let body = Bytes::from_static(br#"{"model":"m","thinking_token_budget":5}"#);
        let req = GenerationRequest::parse(&body, Dialect::Chat).unwrap();
        let out = hook_body(&body, &req, Some(5), "r", false, None).unwrap();
        assert_eq!(
            &out[..],
            br#"{"model":"m","thinking_token_budget":5,"vllm_xargs":{"meridian_request_id":"r"}}"#
        );
        // Sent twice, the last counts: it is the one the engine would read.
        let twice = Bytes::from_static(br#"{"model":"m","vllm_xargs":1,"vllm_xargs":{"own":2}}"#);
        let req = GenerationRequest::parse(&twice, Dialect::Chat).unwrap();
        let out: serde_json::Value =
            serde_json::from_slice(&hook_body(&twice, &req, None, "r", false, None).unwrap()).unwrap();
        assert_eq!(out["vllm_xargs"], serde_json::json!({"own": 2, "meridian_request_id": "r"}));
        let bad = Bytes::from_static(br#"{"model":"m","vllm_xargs":[1]}"#);
        let req = GenerationRequest::parse(&bad, Dialect::Chat).unwrap();
        assert!(hook_body(&bad, &req, None, "r", false, None).is_err());
    }
}
