//! The policy channel between the proxy and the in-engine hook: versioned, authenticated
//! JSON over HTTP/1.1, served by the hook inside vLLM's engine-core process.
//!
//! | Method and path              | Auth   | Body → reply                               |
//! |------------------------------|--------|--------------------------------------------|
//! | `GET /meridian/v1/hello`     | bearer | → [`Hello`] (with the engine's [`EngineState`]) |
//! | `POST /meridian/v1/directives` | bearer | [`DirectiveBatch`] → [`Accepted`]        |
//! | `POST /meridian/v1/sync`     | bearer | [`SyncRequest`] → [`SyncReply`] (hook's own worker processes) |
//! | `POST /meridian/v1/places`   | bearer | [`Claim`] → [`Granted`] (a place in the engine's limit, [`places`]) |
//! | `POST /meridian/v1/places/wait` | bearer | [`PlacesWait`] → [`PlacesFreed`] (held until a place frees) |
//! | `GET /health`, `GET /metrics`| none   | liveness, Prometheus text                  |
//!
//! Every authenticated request carries `Authorization: Bearer <secret>` and
//! `Meridian-Protocol: <major>`; a hook answers a major it does not speak with 400 and
//! the range it does, so neither side acts on messages it might misread. A directive's
//! request id is the proxy's stream id for the request, which reaches the engine as
//! `vllm_xargs.meridian_request_id` (clients choose `X-Request-Id` and may share one);
//! for requests without it, the `X-Request-Id` inside vLLM's own id, see
//! [`base_request_id`].

mod directives;
mod ids;
pub mod places;

use serde::{Deserialize, Serialize};

pub use directives::{DirectiveTable, RequestDirectives};
pub use ids::base_request_id;
pub use places::{
    Claim, Granted, PLACES_PATH, PLACES_WAIT_PATH, Places, PlacesFreed, PlacesWait, WAITING_STALE_S,
};

/// The protocol major version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// Header carrying the sender's protocol major version.
pub const PROTOCOL_HEADER: &str = "meridian-protocol";
pub const HELLO_PATH: &str = "/meridian/v1/hello";
pub const DIRECTIVES_PATH: &str = "/meridian/v1/directives";
pub const SYNC_PATH: &str = "/meridian/v1/sync";

/// The policy a hook reports when it runs disabled, as stock vLLM, on a vLLM release it
/// does not support (`hook.on_unsupported_vllm = "disable"`); it cannot end thinking.
pub const DISABLED_POLICY: &str = "disabled";

/// What the hook says about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    pub min_protocol: u32,
    /// Version of the hook package.
    pub hook_version: String,
    /// The scheduling policy the hook applies.
    pub policy: String,
    /// Whether the hook computes logits entropy and gates exits on it.
    pub entropy: bool,
    /// Whether the hook can force the end of thinking (it knows the delimiter's token).
    pub can_end_thinking: bool,
    /// What the engine is doing, as the hook last saw it (`None`: a hook that does not
    /// publish it, or has not scheduled a step yet). Every proxy replica reads the same
    /// figures, so they count the streams all replicas sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineState>,
}

/// One engine's requests and KV cache as its hook saw them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineState {
    /// Running requests still computing their prompt.
    pub prefilling: u32,
    /// Running requests generating their thought.
    pub thinking: u32,
    /// Running requests generating their answer (or a model's only phase).
    pub answering: u32,
    /// Requests in vLLM's waiting queue (new, or preempted), as of the hook's last count.
    pub waiting: u32,
    /// Free KV cache blocks (`None`: not counted yet).
    #[serde(default)]
    pub kv_free_blocks: Option<u64>,
    /// KV blocks held by running requests, by tier: think-complete, think-active,
    /// output-critical (`meridian_core::kv::Tier`).
    #[serde(default)]
    pub kv_blocks: [u64; 3],
    /// The engine's step time, smoothed over recent busy steps, in seconds (`None`: no
    /// two busy steps yet).
    #[serde(default)]
    pub step_s: Option<f64>,
    /// Steps the hook has scheduled: a reading whose count has not moved is of an idle
    /// engine, or of one whose scheduler has stopped.
    #[serde(default)]
    pub steps: u64,
}

impl EngineState {
    /// Requests the engine holds, running or waiting.
    pub fn requests(&self) -> u32 {
        self.running().saturating_add(self.waiting)
    }

    /// Requests running, every phase.
    pub fn running(&self) -> u32 {
        self.prefilling.saturating_add(self.thinking).saturating_add(self.answering)
    }
}

/// The role of a phase the proxy reports (the hook also derives it from token ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportedPhase {
    Think,
    Output,
}

/// One instruction about one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum Action {
    /// The phase the proxy sees in the stream.
    Phase { phase: ReportedPhase },
    /// Scheduling priority, vLLM's convention: lower runs first.
    Priority { priority: i32 },
    /// End thinking once this many thinking tokens have been generated.
    ThinkBudget { tokens: u32 },
    /// End thinking at the next token.
    EndThinking,
    /// The request is over; drop what is known about it.
    Forget,
}

// No `deny_unknown_fields` here: serde does not support it next to `flatten`; `Action`
// rejects what it does not know.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Directive {
    /// The proxy's stream id for the request (`vllm_xargs.meridian_request_id`), or
    /// vLLM's request id.
    pub request_id: String,
    #[serde(flatten)]
    pub action: Action,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectiveBatch {
    pub directives: Vec<Directive>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Accepted {
    pub accepted: usize,
    /// Sequence number of the last directive stored.
    pub seq: u64,
}

/// A hook process without the listener (a vLLM worker) catching up on directives and
/// handing over its counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncRequest {
    /// Last sequence number already applied (0: none).
    pub after: u64,
    /// Stable name of the reporting process (e.g. `worker-<pid>`).
    pub worker: String,
    /// Counter totals of that process, by metric sample name.
    #[serde(default)]
    pub counters: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncReply {
    /// Sequence number to send as `after` next time.
    pub seq: u64,
    /// Directives after `after`, oldest first. When the table has dropped some of them
    /// (the worker fell too far behind) `snapshot` is set and holds the full state.
    pub directives: Vec<Directive>,
    pub snapshot: bool,
}

/// Why a channel message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    #[error("missing or wrong bearer token")]
    Unauthorized,
    #[error("protocol {got} not spoken here (speaks {min}..={max})")]
    Version { got: String, min: u32, max: u32 },
    #[error("bad message: {0}")]
    BadMessage(String),
}

/// Checks the protocol header a peer sent.
pub fn check_version(header: Option<&str>) -> Result<u32, ChannelError> {
    let got = header.unwrap_or("").trim();
    match got.parse::<u32>() {
        Ok(v) if v == PROTOCOL_VERSION => Ok(v),
        _ => Err(ChannelError::Version { got: got.to_owned(), min: PROTOCOL_VERSION, max: PROTOCOL_VERSION }),
    }
}

/// Checks an `Authorization` header against the shared secret without leaking, through
/// timing, how much of it matched.
pub fn check_bearer(header: Option<&str>, secret: &str) -> Result<(), ChannelError> {
    let presented = header.and_then(|h| h.strip_prefix("Bearer ")).unwrap_or("").as_bytes();
    let expected = secret.as_bytes();
    let mut diff = u8::from(presented.len() != expected.len() || expected.is_empty());
    for (i, &b) in expected.iter().enumerate() {
        diff |= b ^ presented.get(i).copied().unwrap_or(!b);
    }
    if diff == 0 { Ok(()) } else { Err(ChannelError::Unauthorized) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_have_a_stable_wire_form() {
        let d = Directive { request_id: "r1".into(), action: Action::ThinkBudget { tokens: 64 } };
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, r#"{"request_id":"r1","action":"think_budget","tokens":64}"#);
        let end: Directive = serde_json::from_str(r#"{"request_id":"r2","action":"end_thinking"}"#).unwrap();
        assert_eq!(end.action, Action::EndThinking);
        let phase: Directive =
            serde_json::from_str(r#"{"request_id":"r3","action":"phase","phase":"output"}"#).unwrap();
        assert_eq!(phase.action, Action::Phase { phase: ReportedPhase::Output });
        assert!(serde_json::from_str::<Directive>(r#"{"request_id":"r","action":"reboot"}"#).is_err());
    }

    #[test]
    fn versions_other_than_ours_are_refused() {
        assert_eq!(check_version(Some("1")), Ok(1));
        assert!(matches!(check_version(Some("2")), Err(ChannelError::Version { .. })));
        assert!(matches!(check_version(None), Err(ChannelError::Version { .. })));
    }

    #[test]
    fn bearer_must_match_exactly() {
        assert!(check_bearer(Some("Bearer s3cret"), "s3cret").is_ok());
        for bad in [None, Some("Bearer s3cre"), Some("Bearer s3cret!"), Some("s3cret"), Some("Bearer ")] {
            assert_eq!(check_bearer(bad, "s3cret"), Err(ChannelError::Unauthorized), "{bad:?}");
        }
        assert_eq!(
            check_bearer(Some("Bearer "), ""),
            Err(ChannelError::Unauthorized),
            "empty secret never matches"
        );
    }
}
