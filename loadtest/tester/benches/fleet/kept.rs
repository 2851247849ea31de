//! The page's data (`<page>/runs.json.gz`), read back when `FLEET_APPEND=1` adds rounds to
//! it, so that a verdict that needs more rounds than one sitting allows can gather them
//! over several, and a sitting can run only the conditions still unresolved
//! (`FLEET_ONLY`). A round's conversations and arrivals follow from its number alone, so
//! rounds added later are the rounds one longer sitting would have run; the order of its
//! conditions is the list it ran (every condition, or `FLEET_ONLY`'s in its order)
//! rotated by the round's number.

use std::io::Read as _;
use std::path::Path;

use meridian_core::Outcome;
use meridian_loadtest::record::RequestRecord;
use serde_json::{Value, json};

use crate::{Condition, PlaceCounts, Run, Settings, Sharing};

/// One invocation's rounds: the first one's number, how many, the seconds they took, and
/// the conditions they ran (`None`: every one).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sitting {
    pub(crate) first: usize,
    pub(crate) rounds: usize,
    pub(crate) wall_s: f64,
    pub(crate) only: Option<Vec<Condition>>,
}

/// The settings a round's figures depend on, as recorded: rounds added must be measured
/// with the same ones, or they would not be more of the same rounds.
pub(crate) fn recorded(s: &Settings) -> Value {
    json!({
        "engines": s.engines, "streams_per_engine": s.streams, "health_s": s.health_s,
        "conversations": s.conversations, "rate": s.rate, "turns": s.shape.turns,
        "system_tokens": s.shape.system_tokens, "think_time_s": s.shape.think_time_s,
        "lengths": {"input": s.shape.turn.input, "think": s.shape.turn.think, "answer": s.shape.turn.output,
                    "range_ratio": s.shape.turn.range_ratio},
    })
}

/// A condition as the data names it: `routing/replicas/sharing`.
pub(crate) fn condition_name((routing, (replicas, sharing)): Condition) -> String {
    format!("{routing}/{replicas}/{}", sharing.name())
}

/// The condition `name` names (`condition_name`), if the bench has it.
pub(crate) fn condition(name: &str) -> Option<Condition> {
    crate::every_condition().find(|c| condition_name(*c) == name.trim())
}

/// Every round kept at `path` and the sittings that measured them, for settings `s`:
/// refused, naming the setting, where the kept rounds were measured otherwise.
pub(crate) fn read(path: &Path, s: &Settings) -> Result<(Vec<Vec<Run>>, Vec<Sitting>), String> {
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).map_err(|e| fail(&e))?)
        .read_to_string(&mut text)
        .map_err(|e| fail(&e))?;
    let data: Value = serde_json::from_str(&text).map_err(|e| fail(&e))?;
    for (key, value) in recorded(s).as_object().into_iter().flatten() {
        let kept = &data["settings"][key];
        if kept != value {
            return Err(fail(&format!(
                "its rounds were measured with {key} = {kept}, this run has {value}: set it as they had \
                 it, or measure a new page without FLEET_APPEND"
            )));
        }
    }
    let rounds = data["rounds"]
        .as_array()
        .ok_or_else(|| fail(&"no rounds"))?
        .iter()
        .map(|runs| runs.as_array().into_iter().flatten().map(|r| run(r).map_err(|e| fail(&e))).collect())
        .collect::<Result<Vec<Vec<Run>>, String>>()?;
    // Data written before sittings were recorded is one sitting of every condition, its
    // time the sum of its runs' (the engines' starts between them left out).
    let sittings = match data["sittings"].as_array() {
        Some(list) => list.iter().map(|v| sitting(v).map_err(|e| fail(&e))).collect::<Result<Vec<_>, _>>()?,
        None => vec![Sitting {
            first: 0,
            rounds: rounds.len(),
            wall_s: rounds.iter().flatten().map(|r| r.wall_s).sum(),
            only: None,
        }],
    };
    Ok((rounds, sittings))
}

fn sitting(v: &Value) -> Result<Sitting, String> {
    let number = |key: &str| v[key].as_f64().ok_or_else(|| format!("a sitting with no {key}"));
    let only = match v["only"].as_array() {
        None => None,
        Some(names) => Some(
            names
                .iter()
                .map(|n| {
                    let name = n.as_str().unwrap_or_default();
                    condition(name)
                        .ok_or_else(|| format!("a sitting ran {name:?}, no condition of this bench"))
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    Ok(Sitting {
        first: number("first")? as usize,
        rounds: number("rounds")? as usize,
        wall_s: number("wall_s")?,
        only,
    })
}

fn run(r: &Value) -> Result<Run, String> {
    let routing = r["routing"].as_str().unwrap_or_default();
    let routing = crate::ROUTINGS
        .iter()
        .copied()
        .find(|x| *x == routing)
        .ok_or_else(|| format!("a run of no known routing ({routing:?})"))?;
    let sharing_name = r["sharing"].as_str().unwrap_or_default();
    let sharing = Sharing::ALL
        .into_iter()
        .find(|x| x.name() == sharing_name)
        .ok_or_else(|| format!("a run of no known sharing ({sharing_name:?})"))?;
    let places = &r["places"];
    let count = |v: &Value| v.as_f64().unwrap_or(0.0);
    Ok(Run {
        routing,
        replicas: r["replicas"].as_u64().unwrap_or(0) as usize,
        sharing,
        records: r["requests"].as_array().into_iter().flatten().map(record).collect::<Result<_, _>>()?,
        queried: count(&r["queried_tokens"]),
        hit: count(&r["hit_tokens"]),
        peaks: r["peaks"].as_array().into_iter().flatten().map(count).collect(),
        places: PlaceCounts {
            granted: count(&places["granted"]),
            refused: count(&places["refused"]),
            unanswered: count(&places["unanswered"]),
            woken: count(&places["waits_woken"]),
            expired: count(&places["waits_expired"]),
            failed: count(&places["waits_failed"]),
        },
        wall_s: count(&r["wall_s"]),
    })
}

/// A request as the page keeps it ([`slim`]): the figures the page is made of.
fn record(v: &Value) -> Result<RequestRecord, String> {
    let label = v["outcome"].as_str().unwrap_or_default();
    let outcome = Outcome::from_label(label).ok_or_else(|| format!("a request ended {label:?}"))?;
    let time = |key: &str| v[key].as_f64();
    Ok(RequestRecord {
        index: v["index"].as_u64().unwrap_or(0) as usize,
        conversation: v["conversation"].as_u64().map(|x| x as u32),
        turn: v["turn"].as_u64().map(|x| x as u32),
        sent_at: time("sent_at").unwrap_or(0.0),
        ok: v["ok"].as_bool().unwrap_or(false),
        outcome,
        ttft: time("ttft"),
        think_to_output: time("think_to_output"),
        tpot: time("tpot"),
        max_output_gap: time("max_output_gap"),
        e2e: time("e2e"),
        output_itl: v["output_itl_ms"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_f64)
            .map(|ms| ms / 1e3)
            .collect(),
        ..RequestRecord::default()
    })
}

/// What the page's figures are made of, per request.
pub(crate) fn slim(r: &RequestRecord) -> Value {
    json!({
        "index": r.index, "conversation": r.conversation, "turn": r.turn, "sent_at": r.sent_at, "ok": r.ok,
        "outcome": r.outcome, "ttft": r.ttft, "think_to_output": r.think_to_output, "tpot": r.tpot,
        "max_output_gap": r.max_output_gap, "e2e": r.e2e,
        // Milliseconds to a hundredth: the page's pooled answer ITL, at a third of the size.
        "output_itl_ms": r.output_itl.iter().map(|x| (x * 1e5).round() / 100.0).collect::<Vec<_>>(),
    })
}

/// Every round's data and the sittings that measured them, gzipped at `path` (every
/// answer's token gaps are in it).
pub(crate) fn write(path: &Path, s: &Settings, rounds: &[Vec<Run>], sittings: &[Sitting]) {
    let mut settings = recorded(s);
    settings["rounds"] = json!(rounds.len());
    let data = json!({
        "settings": settings,
        "sittings": sittings.iter().map(|t| json!({
            "first": t.first, "rounds": t.rounds, "wall_s": t.wall_s,
            "only": t.only.as_ref().map(|c| c.iter().map(|c| condition_name(*c)).collect::<Vec<_>>()),
        })).collect::<Vec<_>>(),
        "rounds": rounds.iter().map(|runs| runs.iter().map(|r| json!({
            "routing": r.routing, "replicas": r.replicas, "sharing": r.sharing.name(), "queried_tokens": r.queried,
            "hit_tokens": r.hit, "peaks": r.peaks, "wall_s": r.wall_s,
            "places": {"granted": r.places.granted, "refused": r.places.refused, "unanswered": r.places.unanswered,
                       "waits_woken": r.places.woken, "waits_expired": r.places.expired, "waits_failed": r.places.failed},
            "requests": r.records.iter().map(slim).collect::<Vec<_>>(),
        })).collect::<Vec<_>>()).collect::<Vec<_>>(),
    });
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    let file = std::fs::File::create(path).unwrap();
    let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::best());
    serde_json::to_writer(&mut gz, &data).unwrap();
    gz.finish().unwrap();
}
