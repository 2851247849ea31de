//! The fuzz targets' bodies. Each takes arbitrary bytes, drives one parser the way the
//! proxy does, and panics only when a property the proxy relies on breaks; any other
//! panic is a bug the fuzzer found. libFuzzer runs them from `fuzz/libfuzzer/` (see
//! `scripts/fuzz.sh`); `tests/corpus.rs` replays the committed corpora through them in
//! the ordinary test suite.
//!
//! Inputs that need more than one value (a stream and where it is cut, a config and its
//! overrides) carry them in one byte string: see each function.

use meridian_core::stream::{Dialect, SseDecoder};
use meridian_core::{Delta, ModelRegistry, PhaseEvent, PhaseRouter};
use meridian_proxy::internals::{ClientAsked, Emit, GenerationRequest, Splicer, hook_body, upstream_body};

/// A fuzz target: arbitrary bytes in, a panic only on a bug.
pub type Target = fn(&[u8]);

/// Every target by name, as `scripts/fuzz.sh` and the corpus test know them.
pub const TARGETS: [(&str, Target); 5] = [
    ("sse_split", sse_split),
    ("chunk_router", chunk_router),
    ("config", config),
    ("request_body", request_body),
    ("splice", splice),
];

/// Cut points taken from an input's first byte: the rest is split into pieces of
/// 1 + (that byte's bits) bytes, cycling, so one input covers many splittings.
fn pieces(data: &[u8]) -> (Vec<&[u8]>, &[u8]) {
    let Some((&seed, body)) = data.split_first() else { return (Vec::new(), data) };
    let mut out = Vec::new();
    let mut rest = body;
    let mut i = 0u32;
    while !rest.is_empty() {
        let len = 1 + ((seed.rotate_left(i) as usize) & 0x1f);
        let (a, b) = rest.split_at(len.min(rest.len()));
        out.push(a);
        rest = b;
        i += 1;
    }
    (out, body)
}

/// The SSE decoder hands over the same `data:` payloads, and the same `[DONE]`
/// verdict, however the stream is cut into network reads.
pub fn sse_split(data: &[u8]) {
    let (parts, whole) = pieces(data);
    let mut one = SseDecoder::new();
    let mut expected: Vec<Vec<u8>> = Vec::new();
    one.feed(whole, |p| expected.push(p.to_vec()));
    let mut split = SseDecoder::new();
    let mut got: Vec<Vec<u8>> = Vec::new();
    for p in parts {
        split.feed(p, |d| got.push(d.to_vec()));
    }
    assert_eq!(got, expected, "payloads depend on where the stream was cut");
    assert_eq!(split.saw_done(), one.saw_done());
}

/// The streaming APIs.
const DIALECTS: [Dialect; 3] = [Dialect::Chat, Dialect::Responses, Dialect::Messages];

/// What a stream's chunks tell the phase tracker, given the events and final token
/// counts, does not depend on where the stream was cut; nothing panics on any chunk, in
/// any API's parser (each input is read by all three).
pub fn chunk_router(data: &[u8]) {
    for dialect in DIALECTS {
        chunk_router_in(dialect, data);
    }
}

fn chunk_router_in(dialect: Dialect, data: &[u8]) {
    let registry = registry();
    let run = |parts: &[&[u8]]| {
        // The family chosen by the input: every built-in one gets its turn.
        let families: Vec<_> = registry.families().collect();
        let family = data.first().and_then(|b| families.get(*b as usize % (families.len() + 1)).cloned());
        let mut router = PhaseRouter::new(family.cloned()).with_think_budget(8);
        let mut events: Vec<PhaseEvent> = Vec::new();
        let mut decoder = SseDecoder::new();
        for p in parts {
            decoder.feed(p, |payload| {
                let _ = dialect.parse(payload, |c| {
                    let delta = Delta {
                        reasoning: c.reasoning.as_deref(),
                        content: c.content.as_deref(),
                        token_ids: c.token_ids.as_deref(),
                    };
                    events.extend(router.observe(delta));
                });
            });
        }
        events.extend(router.finish());
        (events, router.phase(), router.think_tokens(), router.output_tokens())
    };
    let (parts, whole) = pieces(data);
    assert_eq!(run(&parts), run(&[whole]), "tracking depends on where the stream was cut");
}

/// The built-in model families, loaded once: parsing them on every input would be most
/// of each execution.
fn registry() -> &'static ModelRegistry {
    static REGISTRY: std::sync::LazyLock<ModelRegistry> = std::sync::LazyLock::new(|| {
        ModelRegistry::builtin().unwrap_or_else(|e| panic!("built-in model families must load: {e}"))
    });
    &REGISTRY
}

/// The config loader and its validation answer any text and overrides with a config or
/// an error, never a panic. Input: TOML text, then optionally a 0 byte and `--set`
/// overrides, one per line.
pub fn config(data: &[u8]) {
    let (text, sets) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let text = String::from_utf8_lossy(text);
    let overrides: Vec<_> = String::from_utf8_lossy(sets)
        .lines()
        .filter_map(|l| meridian_core::config::Override::parse(l, "--set").ok())
        .collect();
    if let Ok(cfg) = meridian_proxy::config::parse_config(&text, "fuzz.toml", &overrides) {
        let _ = cfg.validate(registry());
    }
    // The hook's view of the same text: its own sections, the rest left to the proxy.
    let engine: Result<meridian_core::config::EngineFile, _> =
        meridian_core::config::parse_config(&text, "fuzz.toml", &overrides);
    if let Ok(cfg) = engine {
        let _ = meridian_core::config::ConfigFile::validate(&cfg, registry());
    }
}

/// A request body is accepted or refused with a 400, never a panic; one accepted is
/// forwarded as a JSON object without Meridian's extension, with the budget and the
/// stream id where the engine looks for them (and, for the hook, the proxy's own figure of
/// the request's wait in its queue), and without the client's `priority` when its tenant
/// may not set one.
pub fn request_body(data: &[u8]) {
    let body = bytes::Bytes::copy_from_slice(data);
    let dialect = DIALECTS[data.len() % DIALECTS.len()];
    let Ok(req) = GenerationRequest::parse(&body, dialect) else { return };
    let budget = data.len() as u32 % 3;
    let budget = (budget > 0).then_some(budget * 100);
    let drop_priority = data.len() / 7 % 2 == 1;
    // Members as raw text: a value is copied verbatim, and valid JSON such as `1E424`
    // is beyond serde_json's number range (the engine's parser reads it as infinity).
    let object = |b: &[u8]| -> std::collections::HashMap<String, Box<serde_json::value::RawValue>> {
        serde_json::from_slice(b).unwrap_or_else(|e| panic!("forwarded body is not a JSON object: {e}"))
    };
    let sent = object(&body);
    let dropped = |key: &str| drop_priority && key == "priority";
    if let Ok(up) = upstream_body(&body, &req, budget, drop_priority) {
        // Only chat and completions carry a budget in the body (see `upstream_body`).
        let set_budget = budget.filter(|b| req.client_budget != Some(*b) && dialect == Dialect::Chat);
        if sent.contains_key("meridian") || set_budget.is_some() || sent.keys().any(|k| dropped(k)) {
            let m = object(&up);
            assert!(!m.contains_key("meridian"), "the extension went upstream");
            assert!(!(drop_priority && m.contains_key("priority")), "a priority not allowed went upstream");
            if let Some(b) = set_budget {
                assert_eq!(m["thinking_token_budget"].get(), b.to_string(), "the budget did not go upstream");
            }
            for (key, value) in &sent {
                if key != "meridian" && key != "thinking_token_budget" && !dropped(key) {
                    assert_eq!(
                        m.get(key).map(|v| v.get()),
                        Some(value.get()),
                        "{key} was not relayed as sent"
                    );
                }
            }
        } else {
            assert_eq!(up, body, "an unchanged request is relayed byte for byte");
        }
    }
    // Some requests waited in the admission queue (milliseconds, 0: not at all).
    let queued = std::time::Duration::from_millis(data.len() as u64 / 5 % 4 * 700);
    if let Ok(hooked) = hook_body(&body, &req, budget, "mrd_fuzz_1", drop_priority, Some(queued)) {
        let m = object(&hooked);
        assert!(!m.contains_key("meridian"));
        assert!(!(drop_priority && m.contains_key("priority")), "a priority not allowed went to the hook");
        let xargs: serde_json::Value =
            serde_json::from_str(m["vllm_xargs"].get()).expect("vllm_xargs is JSON");
        assert_eq!(xargs["meridian_request_id"], "mrd_fuzz_1");
        // Only the proxy's own figure of the wait reaches the hook, never a client's.
        let waited = xargs.get(meridian_proxy::body::QUEUED_ARG).and_then(serde_json::Value::as_u64);
        assert_eq!(
            waited,
            (!queued.is_zero()).then_some(queued.as_millis() as u64),
            "the wait the hook is told"
        );
    }
}

/// Two legs of chunks, one per line, the first byte choosing what the client asked for
/// and where the first leg is cut: the splicer rewrites or drops chunks, never panics,
/// and every chunk of the second leg it lets through carries the first leg's id.
pub fn splice(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else { return };
    let asked =
        ClientAsked { usage: flags & 1 != 0, continuous_usage: flags & 2 != 0, logprobs: flags & 4 != 0 };
    let mut splicer = Splicer::new(asked, flags & 8 != 0);
    let lines: Vec<&[u8]> = rest.split(|b| *b == b'\n').collect();
    let cut_at = (flags >> 4) as usize % (lines.len() + 1);
    let mut first_id = None;
    for (i, line) in lines.iter().enumerate() {
        let Ok(chunk) = serde_json::from_slice::<serde_json::Value>(line) else { continue };
        if i < cut_at {
            if first_id.is_none() {
                first_id = chunk.get("id").cloned();
            }
            if let Emit::Changed(out) = splicer.first_leg(line) {
                assert!(
                    serde_json::from_slice::<serde_json::Value>(&out).is_ok(),
                    "a rewritten chunk is not JSON"
                );
            }
            continue;
        }
        if i == cut_at {
            // Any share of the first leg may have been answer (a hand-over), even more
            // than the server counted.
            let _ = splicer.cut(i as u32, (i as u32).wrapping_mul(7) % 5);
        }
        if let Emit::Changed(out) = splicer.second_leg(line) {
            let out: serde_json::Value =
                serde_json::from_slice(&out).unwrap_or_else(|e| panic!("a rewritten chunk is not JSON: {e}"));
            if let (Some(id), Some(obj)) = (&first_id, out.as_object())
                && obj.contains_key("id")
            {
                assert_eq!(obj.get("id"), Some(id), "a continuation chunk kept its own id");
            }
        }
    }
}
