//! However the upstream's bytes are cut — inside a `</think>` tag, inside a JSON string,
//! inside a multi-byte character, one byte at a time — the client receives the same bytes
//! and the tracker sees exactly one think → output switch.

mod support;

use support::*;

async fn run_split(rig: &Rig, fixture: &str, model: &str, family: &str, split: &str, n: f64) {
    let got = receive(rig.chat(model, fixture, &[("x-mock-split", split)])).await;
    let expected = rig.mocks[0].fixture(fixture).unwrap().body.clone();
    assert_eq!(got.body(), expected.to_vec(), "{fixture} split {split}");
    eventually(&format!("{fixture} split {split} recorded"), || {
        sample(&rig.scrape(), "meridian_think_to_output_gap_seconds_count", &[("family", family)]) == Some(n)
    })
    .await;
}

/// Cuts at every byte offset of the event that carries the first `</think>` (and its
/// neighbours), one request per offset.
#[tokio::test]
async fn end_tag_event_split_at_every_byte_offset() {
    let rig = Rig::new(1).await;
    let fixture = "qwen3-inline-tags";
    let body = rig.mocks[0].fixture(fixture).unwrap().body.clone();
    let tag = body.windows(8).position(|w| w == b"</think>").unwrap();
    let from = tag.saturating_sub(260);
    let to = (tag + 260).min(body.len() - 1);
    let mut n = 0.0;
    for cut in from..to {
        n += 1.0;
        run_split(
            &rig,
            fixture,
            "Qwen/Qwen3-4B-Thinking-2507",
            "qwen3-thinking-2507",
            &format!("{cut},{}", cut + 3),
            n,
        )
        .await;
    }
}

#[tokio::test]
async fn every_form_delivered_one_byte_at_a_time() {
    let rig = Rig::new(1).await;
    for (i, (fixture, model, family)) in [
        ("qwen3-reasoning", "Qwen/Qwen3-8B", "qwen3"),
        ("qwen3-reasoning-content", "Qwen/Qwen3-8B", "qwen3"),
        ("qwen3-inline-tags", "Qwen/Qwen3-4B-Thinking-2507", "qwen3-thinking-2507"),
        ("qwen3-token-ids-stripped", "tiny-qwen3", "tiny"),
    ]
    .iter()
    .enumerate()
    {
        let _ = i;
        let before =
            sample(&rig.scrape(), "meridian_think_to_output_gap_seconds_count", &[("family", family)])
                .unwrap_or(0.0);
        run_split(&rig, fixture, model, family, "1", before + 1.0).await;
    }
}

#[tokio::test]
async fn harmony_split_at_every_byte_offset_of_its_first_markers() {
    let rig = Rig::new(1).await;
    let fixture = "gpt-oss-harmony";
    for cut in 1..400 {
        let split = format!("{cut}");
        let got = receive(rig.generate(
            "/v1/completions",
            "openai/gpt-oss-20b",
            fixture,
            &[("x-mock-split", &split)],
        ))
        .await;
        assert_eq!(got.body(), rig.mocks[0].fixture(fixture).unwrap().body.to_vec());
        let n = f64::from(cut);
        eventually("recorded", || {
            sample(&rig.scrape(), "meridian_think_to_output_gap_seconds_count", &[("family", "gpt-oss")])
                == Some(n)
        })
        .await;
    }
}
