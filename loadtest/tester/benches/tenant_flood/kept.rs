//! The page's data (`tenant-flood/runs.json`): written after every measurement, and read
//! back when `FLOOD_APPEND=1` adds rounds to it, so a verdict that needs more rounds than
//! one sitting allows can gather them over several. A round's requests, arrivals and
//! order of conditions follow from its number alone, so rounds 4-7 added to rounds 0-3
//! are the rounds `FLOOD_ROUNDS=8` would have run in one go.

use std::path::Path;

use meridian_core::Outcome;
use meridian_loadtest::record::RequestRecord;
use serde_json::{Value, json};

use crate::{Condition, Flood, Run, Settings};

/// What an earlier measurement left: the capacity its rounds were sent by, its rounds,
/// and the sittings that measured them.
pub(crate) struct Kept {
    pub(crate) capacity: f64,
    pub(crate) rounds: Vec<Vec<Run>>,
    pub(crate) sittings: Vec<Sitting>,
}

/// One invocation's rounds: the first one's number, how many, the seconds they took, and
/// what its measurer said of it (`FLOOD_NOTE`: say, what changed in the code since the
/// sitting before).
pub(crate) struct Sitting {
    pub(crate) first: usize,
    pub(crate) rounds: usize,
    pub(crate) wall_s: f64,
    pub(crate) note: Option<String>,
}

/// The settings a round's figures depend on, as recorded: added rounds must be measured
/// with the same ones, or they would not be more of the same rounds.
fn recorded(s: &Settings) -> Value {
    json!({
        "victims": s.victims, "victim_load": s.victim_load, "flood_load": s.flood_load,
        "streams": s.streams, "cap": s.cap, "health_s": s.health_s, "profile": s.profile,
        // The measured profile by its place in the repository, wherever the clone is.
        "profile_file": s.profile_file.as_ref().map(|f| if f.ends_with(crate::MEASURED_PROFILE.0) {
            crate::MEASURED_PROFILE.0.to_owned()
        } else {
            f.display().to_string()
        }),
        "lengths": {"input": s.lengths.input, "think": s.lengths.think, "answer": s.lengths.output,
                    "range_ratio": s.lengths.range_ratio},
    })
}

/// Reads the kept data at `path` for `s`: refused, naming the setting, where the kept
/// rounds were measured otherwise.
pub(crate) fn read(path: &Path, s: &Settings) -> Result<Kept, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let data: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let settings = &data["settings"];
    let wanted = recorded(s);
    for (key, value) in wanted.as_object().into_iter().flatten() {
        // Data kept before a setting was recorded ran with its default then.
        let kept = settings.get(key).unwrap_or(value);
        if kept != value {
            return Err(format!(
                "{}: its rounds were measured with {key} = {kept}, this run has {value}: \
                 set it as they had it, or measure a new page without FLOOD_APPEND",
                path.display()
            ));
        }
    }
    let number = |v: &Value, what: &str| v.as_f64().ok_or_else(|| format!("{}: no {what}", path.display()));
    let capacity = number(&settings["capacity_rps"], "settings.capacity_rps")?;
    let rounds = data["rounds"]
        .as_array()
        .ok_or_else(|| format!("{}: no rounds", path.display()))?
        .iter()
        .map(|runs| {
            runs.as_array().into_iter().flatten().map(|r| run(r, path)).collect::<Result<Vec<Run>, String>>()
        })
        .collect::<Result<Vec<Vec<Run>>, String>>()?;
    let sittings = data["sittings"]
        .as_array()
        .ok_or_else(|| format!("{}: no sittings", path.display()))?
        .iter()
        .map(|v| -> Result<Sitting, String> {
            Ok(Sitting {
                first: number(&v["first"], "sitting's first round")? as usize,
                rounds: number(&v["rounds"], "sitting's rounds")? as usize,
                wall_s: number(&v["wall_s"], "sitting's wall_s")?,
                note: v["note"].as_str().map(str::to_owned),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Kept { capacity, rounds, sittings })
}

fn run(r: &Value, path: &Path) -> Result<Run, String> {
    let name = r["condition"].as_str().unwrap_or_default();
    let cond = Condition::ALL
        .into_iter()
        .find(|c| c.name() == name)
        .ok_or_else(|| format!("{}: a run of no known condition ({name:?})", path.display()))?;
    let victims = r["victims"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| record(v, path))
        .collect::<Result<Vec<_>, String>>()?;
    let flood = Flood {
        sent: r["flood"]["sent"].as_u64().unwrap_or(0) as usize,
        admitted: r["flood"]["let_in"].as_f64().unwrap_or(0.0),
        refused: r["flood"]["refused_429"].as_f64().unwrap_or(0.0),
    };
    Ok(Run { cond, victims, flood })
}

/// A request as the page keeps it ([`slim`]): the figures the page is made of.
fn record(v: &Value, path: &Path) -> Result<RequestRecord, String> {
    let label = v["outcome"].as_str().unwrap_or_default();
    let outcome =
        Outcome::from_label(label).ok_or_else(|| format!("{}: a request ended {label:?}", path.display()))?;
    let time = |key: &str| v[key].as_f64();
    Ok(RequestRecord {
        index: v["index"].as_u64().unwrap_or(0) as usize,
        sent_at: time("sent_at").unwrap_or(0.0),
        ok: v["ok"].as_bool().unwrap_or(false),
        outcome,
        ttft: time("ttft"),
        ttfo: time("ttfo"),
        think_to_output: time("think_to_output"),
        max_output_gap: time("max_output_gap"),
        tpot: time("tpot"),
        e2e: time("e2e"),
        ..RequestRecord::default()
    })
}

/// What the page's figures are made of, per request (not every token's time).
fn slim(r: &RequestRecord) -> Value {
    json!({
        "index": r.index, "sent_at": r.sent_at, "ok": r.ok, "outcome": r.outcome, "ttft": r.ttft,
        "ttfo": r.ttfo, "think_to_output": r.think_to_output, "max_output_gap": r.max_output_gap,
        "tpot": r.tpot, "e2e": r.e2e,
    })
}

/// Writes every round's data to `path`.
pub(crate) fn write(path: &Path, s: &Settings, capacity: f64, rounds: &[Vec<Run>], sittings: &[Sitting]) {
    let mut settings = recorded(s);
    settings["rounds"] = json!(rounds.len());
    settings["capacity_rps"] = json!(capacity);
    let data = json!({
        "settings": settings,
        "sittings": sittings.iter()
            .map(|t| json!({"first": t.first, "rounds": t.rounds, "wall_s": t.wall_s, "note": t.note}))
            .collect::<Vec<_>>(),
        "rounds": rounds.iter().map(|runs| runs.iter().map(|r| json!({
            "condition": r.cond.name(),
            "victims": r.victims.iter().map(slim).collect::<Vec<_>>(),
            "flood": {"sent": r.flood.sent, "let_in": r.flood.admitted, "refused_429": r.flood.refused},
        })).collect::<Vec<_>>()).collect::<Vec<_>>(),
    });
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(path, serde_json::to_string(&data).unwrap()).unwrap();
}
