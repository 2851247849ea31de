//! The live registry of open streams, as an operator meets it: the admin listener
//! (`[admin]`) is off unless asked for, answers only with its token, lists each open
//! request with its stage, phase and token counts while it streams, forgets it when it
//! ends, and keeps answering with a thousand streams open. `meridian top` reads it.

use std::time::Duration;

use futures::StreamExt;
use meridian_proxy::streams::{Ending, Stage, StreamList, StreamView};

mod support;
use support::Rig;

/// The qwen3-reasoning fixture cut after seven reasoning deltas (still thinking), and
/// after the first answer delta (answering).
const HANG_THINKING: &str = "1837";
const HANG_ANSWERING: &str = "2508";

/// An admin token in a variable no other test uses.
fn admin_token(var: &str) -> String {
    let token = format!("secret-{var}");
    // SAFETY: each test names its own variable, and nothing else reads or writes it.
    unsafe { std::env::set_var(var, &token) };
    token
}

async fn rig_with_admin(
    var: &str,
    tweak: impl FnOnce(&mut meridian_proxy::config::MeridianConfig),
) -> (Rig, String) {
    let token = admin_token(var);
    let rig = Rig::with(1, |c| {
        c.admin.listen = Some("127.0.0.1:0".into());
        c.admin.token_env = var.into();
        tweak(c);
    })
    .await;
    (rig, token)
}

fn admin_url(rig: &Rig, path: &str) -> String {
    format!("http://{}{path}", rig.proxy.admin_addr.expect("admin listener on"))
}

async fn list(rig: &Rig, token: &str) -> StreamList {
    let resp = rig.client.get(admin_url(rig, "/admin/streams")).bearer_auth(token).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// Opens a streamed chat that the mock stops feeding after `hang_after` bytes, and reads
/// it in the background until the test ends.
fn open_stream(rig: &Rig, hang_after: &str) {
    let req = rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[("x-mock-hang-after-bytes", hang_after)]);
    tokio::spawn(async move {
        let resp = req.send().await.unwrap();
        let mut body = resp.bytes_stream();
        while let Some(Ok(_)) = body.next().await {}
    });
}

/// Every listed stream has been relayed up to where its upstream hangs (seven reasoning
/// deltas): the phase flips at the first, the count settles only at the last.
fn all_thought_seven(l: &StreamList, n: usize) -> bool {
    l.streams.len() == n && l.streams.iter().all(|s| s.phase == "think" && s.think_tokens == 7)
}

async fn wait_for(
    rig: &Rig,
    token: &str,
    what: &str,
    mut cond: impl FnMut(&StreamList) -> bool,
) -> StreamList {
    for _ in 0..500 {
        let l = list(rig, token).await;
        if cond(&l) {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}; last list: {:?}", list(rig, token).await);
}

#[tokio::test]
async fn the_admin_listener_is_off_unless_asked_for() {
    let rig = Rig::new(1).await;
    assert!(rig.proxy.admin_addr.is_none());
    // Nor does the client-facing listener serve the registry.
    let resp = rig.client.get(rig.url("/admin/streams")).send().await.unwrap();
    assert_ne!(resp.status(), 200);
}

#[tokio::test]
async fn the_admin_listener_answers_only_with_its_token() {
    let (rig, token) = rig_with_admin("MERIDIAN_TEST_ADMIN_TOKEN_AUTH", |_| {}).await;
    let url = admin_url(&rig, "/admin/streams");
    let none = rig.client.get(&url).send().await.unwrap();
    assert_eq!(none.status(), 401);
    assert_eq!(none.headers()["www-authenticate"], "Bearer");
    let body: serde_json::Value = none.json().await.unwrap();
    assert_eq!(body["error"]["type"], "unauthorized");
    let wrong = rig.client.get(&url).bearer_auth(format!("{token}x")).send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let right = rig.client.get(&url).bearer_auth(&token).send().await.unwrap();
    assert_eq!(right.status(), 200);
}

#[tokio::test]
async fn a_proxy_asked_for_an_admin_listener_without_a_token_refuses_to_start() {
    let mut cfg = support::config_for(&["http://127.0.0.1:9".into()]);
    cfg.admin.listen = Some("127.0.0.1:0".into());
    cfg.admin.token_env = "MERIDIAN_TEST_ADMIN_TOKEN_NEVER_SET".into();
    let state = meridian_proxy::AppState::new(cfg, support::registry(), Default::default()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = meridian_proxy::Server::start(state, listener).await.err().expect("refused");
    let msg = err.to_string();
    assert!(msg.contains("admin.token_env") && msg.contains("MERIDIAN_TEST_ADMIN_TOKEN_NEVER_SET"), "{msg}");
}

#[tokio::test]
async fn each_stream_is_listed_with_its_phase_and_tokens_until_it_ends() {
    let (rig, token) = rig_with_admin("MERIDIAN_TEST_ADMIN_TOKEN_PHASES", |_| {}).await;
    open_stream(&rig, HANG_THINKING);
    let l = wait_for(&rig, &token, "a thinking stream", |l| all_thought_seven(l, 1)).await;
    let s: &StreamView = &l.streams[0];
    assert_eq!((s.stage, s.phase.as_str(), s.model.as_str()), (Stage::Relaying, "think", "Qwen/Qwen3-8B"));
    assert_eq!((s.think_tokens, s.output_tokens), (7, 0));
    assert_eq!(s.upstream.as_deref(), Some(rig.proxy.state.pool.all()[0].name.as_str()));
    assert_eq!(
        (s.class.as_str(), s.route.as_str(), s.ending),
        ("interactive", "chat_completions", Ending::None)
    );
    assert!(s.stream_id.starts_with("mrd_") && s.streaming);

    // One stream by id; an unknown id is a 404.
    let one: StreamView = rig
        .client
        .get(admin_url(&rig, &format!("/admin/streams/{}", s.stream_id)))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(one.stream_id, s.stream_id);
    let missing = rig
        .client
        .get(admin_url(&rig, "/admin/streams/mrd_nope_1"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);

    open_stream(&rig, HANG_ANSWERING);
    let l = wait_for(&rig, &token, "an answering stream", |l| l.streams_by_phase.output == 1).await;
    assert_eq!(l.open, 2);
    let answering = l.streams.iter().find(|s| s.phase == "output").unwrap();
    assert_eq!((answering.think_tokens, answering.output_tokens), (9, 1));
    assert!(l.streams[0].age_s >= l.streams[1].age_s, "oldest first");

    // A stream that runs to its end leaves the list.
    let whole = rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[]).send().await.unwrap().text().await.unwrap();
    assert!(whole.contains("[DONE]"));
    let l = list(&rig, &token).await;
    assert_eq!(l.open, 2, "only the two hanging streams are open: {l:?}");
}

#[tokio::test]
async fn a_client_that_leaves_takes_its_stream_off_the_list() {
    let (rig, token) = rig_with_admin("MERIDIAN_TEST_ADMIN_TOKEN_LEAVE", |_| {}).await;
    let req = rig.chat("Qwen/Qwen3-8B", "qwen3-reasoning", &[("x-mock-hang-after-bytes", HANG_THINKING)]);
    let resp = req.send().await.unwrap();
    wait_for(&rig, &token, "the stream", |l| l.streams_by_phase.think == 1).await;
    drop(resp);
    wait_for(&rig, &token, "an empty list", |l| l.open == 0).await;
}

#[tokio::test]
async fn requests_waiting_for_admission_are_listed_as_queued() {
    let (rig, token) = rig_with_admin("MERIDIAN_TEST_ADMIN_TOKEN_QUEUE", |c| {
        c.admission.enabled = true;
        c.admission.max_streams = Some(1);
    })
    .await;
    open_stream(&rig, HANG_THINKING);
    wait_for(&rig, &token, "the first stream", |l| l.streams_by_phase.think == 1).await;
    open_stream(&rig, HANG_THINKING);
    let l =
        wait_for(&rig, &token, "a queued request", |l| l.streams.iter().any(|s| s.stage == Stage::Queued))
            .await;
    let queued = l.streams.iter().find(|s| s.stage == Stage::Queued).unwrap();
    assert_eq!((queued.upstream.as_deref(), queued.phase.as_str()), (None, "pending"));
    assert_eq!(l.streams_by_phase.think, 1, "a queued request is not a stream yet");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_answers_with_a_thousand_streams_open() {
    const STREAMS: usize = 1000;
    let (rig, token) = rig_with_admin("MERIDIAN_TEST_ADMIN_TOKEN_THOUSAND", |c| {
        c.upstream.idle_timeout_s = 120.0;
        // A thousand streams opening at once on a busy 2-core machine slow the mock's
        // `/health` past the rig's 0.2 s rounds; marked unhealthy, it would turn the
        // rest of the streams away (503), which is not what this test is about.
        c.upstream.unhealthy_after = 100;
    })
    .await;
    for _ in 0..STREAMS {
        open_stream(&rig, HANG_THINKING);
    }
    let l = wait_for(&rig, &token, "a thousand thinking streams", |l| all_thought_seven(l, STREAMS)).await;
    assert_eq!(l.streams_by_phase.think, STREAMS as u64);
    assert_eq!(l.open, STREAMS);
    assert_eq!(l.streams.len(), STREAMS);
    assert!(l.streams.iter().all(|s| s.think_tokens == 7 && s.stage == Stage::Relaying));
    let ids: std::collections::HashSet<&str> = l.streams.iter().map(|s| s.stream_id.as_str()).collect();
    assert_eq!(ids.len(), STREAMS, "one entry per stream");
    // The gauge and the registry agree.
    let scraped = rig.scrape();
    assert_eq!(
        support::sample(&scraped, "meridian_open_streams", &[("phase", "think")]),
        Some(STREAMS as f64)
    );
}

#[tokio::test]
async fn meridian_top_shows_the_open_streams() {
    let (rig, token) = rig_with_admin("MERIDIAN_TEST_ADMIN_TOKEN_TOP", |_| {}).await;
    open_stream(&rig, HANG_THINKING);
    wait_for(&rig, &token, "the stream", |l| all_thought_seven(l, 1)).await;
    let admin = format!("http://{}", rig.proxy.admin_addr.unwrap());
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_meridian"))
        .args(["top", "--once", "--admin", &admin, "--token-env", "MERIDIAN_TEST_ADMIN_TOKEN_TOP"])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("1 open; relaying 1 thinking, 0 answering"), "{stdout}");
    let row = stdout.lines().find(|l| l.starts_with("mrd_")).expect("a row per stream");
    assert!(row.contains("relaying") && row.contains("think") && row.contains(" 7 "), "{row}");
    assert!(!stdout.contains('\x1b'), "no terminal escapes when the output is not a terminal");

    let denied = tokio::process::Command::new(env!("CARGO_BIN_EXE_meridian"))
        .args(["top", "--once", "--admin", &admin, "--token-env", "MERIDIAN_TEST_ADMIN_TOKEN_AUTH_WRONG"])
        .env("MERIDIAN_TEST_ADMIN_TOKEN_AUTH_WRONG", "not-the-token")
        .output()
        .await
        .unwrap();
    assert_eq!(denied.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&denied.stderr).contains("answered 401"));
}
