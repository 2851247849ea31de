//! Places granted by the engine (`admission.places = "engine"`): proxy replicas in front
//! of one engine claim each request's place from its hook before sending it, so the
//! replicas share the engine's `max_streams` by need (one replica may take every place
//! while the other is idle) and together never pass it. Against an engine twin serving
//! the channel's places the way the hook does (the same table decides). The engines'
//! answers also count the replicas, which replicas never told their number split their
//! tenants' limits by.

mod support;

use std::sync::Arc;
use std::time::Duration;

use meridian_proxy::config::{MeridianConfig, PlacesFrom, TenantConfig};
use meridian_proxy::upstream::{EnginePlaces, PlaceTerms, Turn};
use meridian_sim::server::{TwinOptions, TwinServer};
use meridian_sim::workload::WorkloadSpec;
use serde_json::json;
use support::*;
use tokio::sync::Notify;

const TOKEN_ENV: &str = "MERIDIAN_TEST_PLACES_TOKEN";

/// A twin whose requests think for about ten seconds (so the test holds them open, and
/// ends them by hanging up), serving the channel with `secret`.
async fn slow_twin(secret: Option<&str>) -> TwinServer {
    let opts = TwinOptions {
        channel_secret: secret.map(str::to_owned),
        ..TwinOptions::local(
            meridian_sim::profile("h100-qwen3-8b").unwrap(),
            WorkloadSpec::fixed(20, 1500, 4),
            1.0,
        )
    };
    TwinServer::start(opts, Box::new(meridian_core::sched::Fcfs)).await.unwrap()
}

/// A replica in front of `twin` whose hook is the twin's own address, `max_streams` 2.
async fn replica(twin: &TwinServer, tweak: impl FnOnce(&mut MeridianConfig)) -> meridian_proxy::Server {
    replica_of(&[twin], tweak).await
}

/// A replica in front of `twins`, each engine's hook its twin's own address,
/// `max_streams` 2.
async fn replica_of(
    twins: &[&TwinServer],
    tweak: impl FnOnce(&mut MeridianConfig),
) -> meridian_proxy::Server {
    let engines: Vec<_> = twins.iter().map(|t| (t.url(), Some(t.addr.to_string()))).collect();
    replica_in_front_of(&engines, tweak).await
}

/// A replica in front of `engines` (each its URL and, for one with the hook, the
/// channel's address), asking them for places, `max_streams` 2.
async fn replica_in_front_of(
    engines: &[(String, Option<String>)],
    tweak: impl FnOnce(&mut MeridianConfig),
) -> meridian_proxy::Server {
    // SAFETY: every test here sets the same value before anything reads it.
    unsafe { std::env::set_var(TOKEN_ENV, "places-secret") };
    let mut cfg = config_for(&engines.iter().map(|(url, _)| url.clone()).collect::<Vec<_>>());
    for (endpoint, (_, hook)) in cfg.upstream.endpoints.iter_mut().zip(engines) {
        endpoint.hook = hook.clone();
    }
    cfg.upstream.health_interval_s = 0.1;
    cfg.hook.token_env = TOKEN_ENV.into();
    cfg.admission.enabled = true;
    cfg.admission.max_streams = Some(2);
    cfg.admission.queue_timeout_s = 20.0;
    cfg.admission.places = PlacesFrom::Engine;
    tweak(&mut cfg);
    start_proxy(cfg).await
}

/// Opens a stream through `proxy`; the request holds its place until the response drops.
async fn open(proxy: &meridian_proxy::Server) -> reqwest::Response {
    let (status, got) = try_open(proxy).await;
    assert_eq!(status, 200);
    got
}

/// Sends a request through `proxy`: its status, and the response (an open stream holds
/// its place, and its tenant's slot, until dropped).
async fn try_open(proxy: &meridian_proxy::Server) -> (u16, reqwest::Response) {
    let got = client()
        .post(format!("http://{}/v1/chat/completions", proxy.local_addr))
        .json(&chat(json!({})))
        .send()
        .await
        .unwrap();
    (got.status().as_u16(), got)
}

/// Requests the twin holds (running and waiting), by its own gauges.
async fn held_by(twin: &TwinServer) -> f64 {
    let text = client().get(format!("{}/metrics", twin.url())).send().await.unwrap().text().await.unwrap();
    ["vllm:num_requests_running", "vllm:num_requests_waiting"]
        .iter()
        .map(|name| sample(&text, name, &[]).unwrap_or(f64::NAN))
        .sum()
}

/// Waits until the twin holds `n` requests: an aborted request leaves the engine a moment
/// after its client hangs up.
async fn holds(twin: &TwinServer, n: f64) {
    reaches("the twin's requests held", n, Duration::from_secs(5), || held_by(twin)).await;
}

fn claims(proxy: &meridian_proxy::Server, outcome: &str) -> f64 {
    sample(&proxy.state.metrics.render(), "meridian_admission_place_claims_total", &[("outcome", outcome)])
        .unwrap_or(-1.0)
}

fn queued(proxy: &meridian_proxy::Server) -> f64 {
    sample(&proxy.state.metrics.render(), "meridian_admission_queued", &[("class", "interactive")])
        .unwrap_or(-1.0)
}

/// Waits for a spawned `open` that must still be waiting, checking it has not gone through.
async fn still_waiting(what: &str, pending: &tokio::task::JoinHandle<reqwest::Response>) {
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!pending.is_finished(), "{what}");
}

#[tokio::test]
async fn replicas_share_the_engines_places_by_need_and_never_pass_its_limit() {
    let twin = slow_twin(Some("places-secret")).await;
    let (a, b) = (replica(&twin, |_| {}).await, replica(&twin, |_| {}).await);

    // Replica b is idle, so a may take both places: places go by need, not in parts.
    let a1 = open(&a).await;
    let a2 = open(&a).await;
    holds(&twin, 2.0).await;
    assert_eq!(claims(&a, "granted"), 2.0);

    // b's request finds the engine's places held by a, and waits in b's queue.
    let b_open = tokio::spawn({
        let url = format!("http://{}/v1/chat/completions", b.local_addr);
        async move { client().post(url).json(&chat(json!({}))).send().await.unwrap() }
    });
    eventually("b's request queued", || queued(&b) == 1.0).await;
    still_waiting("b waits while a holds every place", &b_open).await;
    assert!(claims(&b, "refused") >= 1.0, "the engine refused b");
    assert_eq!(held_by(&twin).await, 2.0, "never past the limit");

    // One of a's requests ends: its place goes back, and b's request takes it.
    drop(a1);
    let b1 = tokio::time::timeout(Duration::from_secs(5), b_open).await.expect("b let through").unwrap();
    assert_eq!(b1.status(), 200);
    assert_eq!(queued(&b), 0.0);
    holds(&twin, 2.0).await;

    // Now a's next request waits for b's place, though a holds only one of the two.
    let a_open = tokio::spawn({
        let url = format!("http://{}/v1/chat/completions", a.local_addr);
        async move { client().post(url).json(&chat(json!({}))).send().await.unwrap() }
    });
    eventually("a's request queued", || queued(&a) == 1.0).await;
    still_waiting("a waits while b holds the other place", &a_open).await;
    drop(b1);
    let a3 = tokio::time::timeout(Duration::from_secs(5), a_open).await.expect("a let through").unwrap();
    assert_eq!(a3.status(), 200);
    holds(&twin, 2.0).await;
    drop((a2, a3));
}

#[tokio::test]
async fn an_engine_that_answers_no_claim_is_decided_by_the_replica_alone() {
    // A twin serving no channel: every claim is answered 404.
    let twin = slow_twin(None).await;
    let a = replica(&twin, |_| {}).await;
    let first = open(&a).await;
    assert_eq!(claims(&a, "unanswered"), 1.0, "the request went all the same");
    let second = open(&a).await;
    assert_eq!(claims(&a, "unanswered"), 1.0, "not asked again until a renewal is answered");
    // The replica's own count holds the limit.
    let third = tokio::spawn({
        let url = format!("http://{}/v1/chat/completions", a.local_addr);
        async move { client().post(url).json(&chat(json!({}))).send().await.unwrap() }
    });
    eventually("the third queued", || queued(&a) == 1.0).await;
    drop(first);
    let third = tokio::time::timeout(Duration::from_secs(5), third).await.expect("let through").unwrap();
    assert_eq!(third.status(), 200);
    drop((second, third));
}

#[tokio::test]
async fn requests_waiting_for_a_full_engine_ask_it_one_at_a_time() {
    let twin = slow_twin(Some("places-secret")).await;
    let (a, b) = (replica(&twin, |_| {}).await, replica(&twin, |_| {}).await);
    let held = (open(&a).await, open(&a).await);
    // Six requests wait at b for an engine whose places a holds.
    let waiting: Vec<_> = (0..6)
        .map(|_| {
            let url = format!("http://{}/v1/chat/completions", b.local_addr);
            tokio::spawn(async move { client().post(url).json(&chat(json!({}))).send().await.unwrap() })
        })
        .collect();
    eventually("all six queued", || queued(&b) == 6.0).await;
    let before = claims(&b, "refused");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = claims(&b, "refused") - before;
    // After a refusal the engine is asked again every 25 ms by one claim (and when its
    // hook wakes the replica, which nothing here does), not by each of the six: about 20
    // in half a second (fewer on a busy machine), never six times that.
    assert!((1.0..=40.0).contains(&asked), "the full engine was asked {asked} times in 0.5 s");
    assert!(waiting.iter().all(|w| !w.is_finished()));
    holds(&twin, 2.0).await;
    // a's places free: two of b's six go, the rest wait on.
    drop(held);
    eventually("two of b's let through", || queued(&b) == 4.0).await;
    holds(&twin, 2.0).await;
    for w in waiting {
        w.abort();
    }
}

#[tokio::test]
async fn a_freed_place_goes_to_the_request_that_waited_longest_whichever_replica_holds_it() {
    let twin = slow_twin(Some("places-secret")).await;
    let (a, b) = (replica(&twin, |_| {}).await, replica(&twin, |_| {}).await);
    let (a1, a2) = (open(&a).await, open(&a).await);
    let spawn_open = |proxy: &meridian_proxy::Server| {
        let url = format!("http://{}/v1/chat/completions", proxy.local_addr);
        tokio::spawn(async move { client().post(url).json(&chat(json!({}))).send().await.unwrap() })
    };
    // b's request waits first; then a newer one at a, the replica holding both places.
    let older = spawn_open(&b);
    eventually("b's request queued", || queued(&b) == 1.0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let newer = spawn_open(&a);
    eventually("a's request queued", || queued(&a) == 1.0).await;
    // One of a's places frees. a hears of it first, but the place is kept for b's request.
    drop(a1);
    let got =
        tokio::time::timeout(Duration::from_secs(5), older).await.expect("b's request let through").unwrap();
    assert_eq!(got.status(), 200);
    still_waiting("a's newer request waits for the next place", &newer).await;
    holds(&twin, 2.0).await;
    drop(a2);
    let got =
        tokio::time::timeout(Duration::from_secs(5), newer).await.expect("a's request let through").unwrap();
    assert_eq!(got.status(), 200);
}

/// A request sent through `proxy` that must queue there and stay queued: its handle.
async fn queued_behind(
    proxy: &meridian_proxy::Server,
    what: &str,
) -> tokio::task::JoinHandle<reqwest::Response> {
    let waiting = tokio::spawn({
        let url = format!("http://{}/v1/chat/completions", proxy.local_addr);
        async move { client().post(url).json(&chat(json!({}))).send().await.unwrap() }
    });
    eventually("the request queued", || queued(proxy) == 1.0).await;
    still_waiting(what, &waiting).await;
    waiting
}

fn waits(proxy: &meridian_proxy::Server, outcome: &str) -> f64 {
    sample(&proxy.state.metrics.render(), "meridian_admission_place_waits_total", &[("outcome", outcome)])
        .unwrap_or(-1.0)
}

#[tokio::test]
async fn a_place_freed_at_another_replica_wakes_the_waiting_one_through_the_engine() {
    let twin = slow_twin(Some("places-secret")).await;
    let with_waits = |c: &mut MeridianConfig| c.admission.place_waits = true;
    let (a, b) = (replica(&twin, with_waits).await, replica(&twin, with_waits).await);
    let (a1, a2) = (open(&a).await, open(&a).await);
    let waiting = queued_behind(&b, "b waits while a holds every place").await;
    assert_eq!(waits(&a, "woken"), 0.0, "a, never refused, waits on no engine");
    // One of a's requests ends. Only the engine hears of it; it answers the wait b's
    // replica holds there, and b's request asks at once.
    drop(a1);
    let got = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("b let through").unwrap();
    assert_eq!(got.status(), 200);
    assert!(waits(&b, "woken") >= 1.0, "b's replica was not woken by the engine");
    assert_eq!(waits(&b, "failed"), 0.0);
    holds(&twin, 2.0).await;
    drop((a2, got));
}

#[tokio::test]
async fn by_default_a_refused_replica_asks_again_on_its_timer_and_holds_no_wait() {
    let twin = slow_twin(Some("places-secret")).await;
    let (a, b) = (replica(&twin, |_| {}).await, replica(&twin, |_| {}).await);
    let (a1, a2) = (open(&a).await, open(&a).await);
    let waiting = queued_behind(&b, "b waits while a holds every place").await;
    drop(a1);
    let got = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("b let through").unwrap();
    assert_eq!(got.status(), 200);
    for outcome in ["woken", "expired", "failed"] {
        assert_eq!(waits(&b, outcome), 0.0, "no wait held on the engine ({outcome})");
    }
    drop((a2, got));
}

/// A claim sent straight to `twin`'s places as another replica would.
async fn raw_claim(twin: &TwinServer, holder: &str, held: u32, want: u32) -> meridian_core::channel::Granted {
    claim_as_replica(twin, TOKEN_ENV, holder, held, want).await
}

#[tokio::test]
async fn a_replica_whose_request_got_a_place_elsewhere_withdraws_its_turn_at_the_full_engine() {
    let (e1, e2) = (slow_twin(Some("places-secret")).await, slow_twin(Some("places-secret")).await);
    let b = replica_of(&[&e1, &e2], |c| {
        c.admission.max_streams = Some(1);
        // Probes that time out after 0.1 s on a busy machine would mark both twins down
        // (and fail the waiting request) before the places are what is tested.
        c.upstream.health_interval_s = 1.0;
    })
    .await;
    // Another replica holds both engines' only place.
    assert!(raw_claim(&e1, "other", 0, 1).await.granted && raw_claim(&e2, "other", 0, 1).await.granted);
    let waiting = tokio::spawn({
        let url = format!("http://{}/v1/chat/completions", b.local_addr);
        async move { client().post(url).json(&chat(json!({}))).send().await.unwrap() }
    });
    // b's request is refused at both, and keeps its turn at e1: a newer request asking
    // there finds one ahead of it.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while raw_claim(&e1, "probe", 0, 1).await.ahead == 0 {
        assert!(std::time::Instant::now() < deadline, "b's turn never showed at e1");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(claims(&b, "withdrawn"), -1.0, "nothing to withdraw yet");
    // e2's place frees; b's request takes it, and b, with nobody else waiting, gives up
    // its turn at e1 at once instead of letting it hold e1's next place a while.
    raw_claim(&e2, "other", 0, 0).await;
    let got = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("b let through").unwrap();
    let status = got.status();
    assert_eq!(status, 200, "{}", got.text().await.unwrap_or_default());
    eventually("b withdrew its turn at e1", || claims(&b, "withdrawn") == 1.0).await;
    assert_eq!(raw_claim(&e1, "probe", 0, 1).await.ahead, 0, "e1 still keeps a turn for b");
    drop(got);
}

#[tokio::test]
async fn a_retry_goes_only_where_the_engine_grants_it_a_place() {
    let engine = slow_twin(Some("places-secret")).await;
    // An engine without the hook that refuses the request (503), so it is retried.
    let refusing = meridian_mock_upstream::MockUpstream::start(mock_options()).await.unwrap();
    let engines = [(refusing.url(), None), (engine.url(), Some(engine.addr.to_string()))];
    let b = replica_in_front_of(&engines, |c| {
        c.admission.max_streams = Some(1);
        c.upstream.health_interval_s = 1.0;
    })
    .await;
    let send = || {
        client()
            .post(format!("http://{}/v1/chat/completions", b.local_addr))
            .header("x-mock-status", "503")
            .json(&chat(json!({})))
            .send()
    };
    // Another replica holds the engine's only place: the request refused by the other
    // upstream has nowhere to go, and says the client may try again.
    assert!(raw_claim(&engine, "other", 0, 1).await.granted);
    let got = tokio::time::timeout(Duration::from_secs(10), send()).await.expect("answered").unwrap();
    assert_eq!(got.status(), 502, "{}", got.text().await.unwrap_or_default());
    assert_eq!(got.headers()["x-meridian-retry-safe"], "true");
    holds(&engine, 0.0).await;
    assert_eq!(held_by(&engine).await, 0.0, "the retry took the engine past its limit");
    // With the place free, the retry claims it there and is served.
    raw_claim(&engine, "other", 0, 0).await;
    let granted = claims(&b, "granted").max(0.0);
    let got = tokio::time::timeout(Duration::from_secs(10), send()).await.expect("answered").unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(claims(&b, "granted"), granted + 1.0, "served without a place");
    holds(&engine, 1.0).await;
    drop(got);
}

fn replicas_counted(proxy: &meridian_proxy::Server) -> f64 {
    sample(&proxy.state.metrics.render(), "meridian_admission_replicas_counted", &[]).unwrap_or(-1.0)
}

#[tokio::test]
async fn replicas_never_told_their_number_split_a_tenants_limit_by_the_replicas_the_engine_counts() {
    let twin = slow_twin(Some("places-secret")).await;
    // An autoscaled fleet's config: no `admission.replicas`; the tenant may hold 2.
    let fleet = |c: &mut MeridianConfig| {
        c.admission.max_streams = Some(8);
        c.tenants.enabled = true;
        c.tenants.tenant =
            vec![TenantConfig { name: "search".into(), max_streams: Some(2), ..TenantConfig::default() }];
        c.tenants.default_tenant = Some("search".into());
        c.upstream.idle_timeout_s = 30.0;
    };
    let a = replica(&twin, fleet).await;
    // Alone, a holds both of the tenant's streams; the engine's answers count one replica.
    let (a1, a2) = (try_open(&a).await, try_open(&a).await);
    assert_eq!((a1.0, a2.0), (200, 200));
    assert_eq!(replicas_counted(&a), 1.0);
    assert_eq!(try_open(&a).await.0, 429, "the tenant's two streams are open");
    drop((a1, a2));
    holds(&twin, 0.0).await;

    // The autoscaler adds b. Once both have renewed at the engine (each second), it
    // counts two, and each lets in its one of the two.
    let b = replica(&twin, fleet).await;
    try_open(&b).await; // b's first claim puts it on the roster.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while replicas_counted(&a) != 2.0 || replicas_counted(&b) != 2.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a counts {}, b {}",
            replicas_counted(&a),
            replicas_counted(&b)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    holds(&twin, 0.0).await;
    let (from_a, from_b) = (try_open(&a).await, try_open(&b).await);
    assert_eq!((from_a.0, from_b.0), (200, 200));
    assert_eq!((try_open(&a).await.0, try_open(&b).await.0), (429, 429), "one each, two in all");
    holds(&twin, 2.0).await;
    drop((from_a, from_b));

    // b goes away: when its lease at the engine runs out, a holds both again.
    drop(b);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while replicas_counted(&a) != 1.0 {
        assert!(std::time::Instant::now() < deadline, "a still counts {}", replicas_counted(&a));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    holds(&twin, 0.0).await;
    let (a1, a2) = (try_open(&a).await, try_open(&a).await);
    assert_eq!((a1.0, a2.0), (200, 200));
}

/// Claims on `proxy`'s engines as the test states them, driving `EnginePlaces` directly
/// (the places held at each engine are the replica's own count).
fn claims_as_test(proxy: &meridian_proxy::Server) -> Arc<PlaceTerms> {
    Arc::new(PlaceTerms {
        channel: proxy.state.hook.clone(),
        holder: "test".into(),
        limit: 2,
        metrics: Arc::clone(&proxy.state.metrics),
        waits: false,
        roster: Arc::default(),
    })
}

#[tokio::test]
async fn a_place_granted_to_a_request_that_went_away_before_reading_it_goes_back() {
    let twin = slow_twin(Some("places-secret")).await;
    let proxy = replica(&twin, |_| {}).await;
    let (engine, terms, addr) =
        (Arc::clone(&proxy.state.pool.all()[0]), claims_as_test(&proxy), twin.addr.to_string());
    let wake = Arc::new(Notify::new());
    let mut claim = Box::pin(EnginePlaces::claim(&engine, &addr, &terms, Turn::default(), &wake));
    assert!(futures::poll!(claim.as_mut()).is_pending(), "the claim is out");
    counts_places(&twin, TOKEN_ENV, 1, Duration::from_secs(5), "granted").await;
    // A renewal takes its turn after the claim's answer is sent: the grant is waiting for
    // its request, which goes away without reading it.
    engine.places.renew(&terms, &addr).await;
    drop(claim);
    // Well inside the engine's lease (5 s): only giving the place back frees it.
    counts_places(&twin, TOKEN_ENV, 0, Duration::from_secs(3), "the grant was dropped unread").await;
}

#[tokio::test]
async fn a_replica_shutting_down_keeps_its_places_while_its_streams_drain() {
    let twin = slow_twin(Some("places-secret")).await;
    let proxy = replica(&twin, |c| c.server.shutdown_grace_s = 30.0).await;
    let stream = open(&proxy).await;
    counts_places(&twin, TOKEN_ENV, 1, Duration::from_secs(5), "the stream's place").await;
    let stopping = tokio::spawn(proxy.shutdown());
    // Past the engine's lease (5 s), the stream still open: only renewals keep it counted,
    // so no other replica is granted a place the stream still uses.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(places_counted(&twin, TOKEN_ENV).await, 1, "the draining stream's place was given away");
    drop(stream);
    let stopped = tokio::time::timeout(Duration::from_secs(10), stopping).await;
    assert!(matches!(stopped, Ok(Ok(Ok(())))), "{stopped:?}");
}

#[tokio::test]
async fn a_slow_hook_at_one_engine_does_not_let_another_engines_lease_lapse() {
    let twin = slow_twin(Some("places-secret")).await;
    let silent = silent_hook().await;
    // Engine 0's hook never answers (and it serves a model nobody asks for); engine 1 is
    // the twin.
    let engines =
        [(format!("http://{silent}"), Some(silent.to_string())), (twin.url(), Some(twin.addr.to_string()))];
    let proxy = replica_in_front_of(&engines, |c| {
        c.upstream.endpoints[0].models = Some(vec!["nobody-asks-for-this".into()]);
    })
    .await;
    let stream = open(&proxy).await;
    counts_places(&twin, TOKEN_ENV, 1, Duration::from_secs(5), "the stream's place at the twin").await;
    // Messages to engine 0 queue behind each other, each waiting out its answer's
    // timeout: its renewals wait about 8 s.
    let (slow, terms) = (Arc::clone(&proxy.state.pool.all()[0]), claims_as_test(&proxy));
    for _ in 0..8 {
        let (slow, terms, addr) = (Arc::clone(&slow), Arc::clone(&terms), silent.to_string());
        tokio::spawn(async move { slow.places.renew(&terms, &addr).await });
    }
    // Past the twin's lease (5 s): its place stays counted only if its renewals went on.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(places_counted(&twin, TOKEN_ENV).await, 1, "the twin's lease lapsed behind the slow hook");
    drop(stream);
}

#[tokio::test]
async fn streams_sent_while_the_hook_was_away_count_at_the_engine_once_it_answers_again() {
    let twin = slow_twin(Some("places-secret")).await;
    let relay = HookRelay::start(twin.addr).await;
    relay.cut();
    let a = replica_in_front_of(&[(twin.url(), Some(relay.addr.to_string()))], |_| {}).await;
    // The hook answers no claim: after a few, the replica decides alone, by its own
    // count against `max_streams` (2).
    let streams = (open(&a).await, open(&a).await);
    holds(&twin, 2.0).await;
    assert_eq!(places_counted(&twin, TOKEN_ENV).await, 0, "the engine heard of no stream yet");
    relay.mend();
    // The renewal that finds the hook answering again states both streams.
    counts_places(&twin, TOKEN_ENV, 2, Duration::from_secs(5), "the streams sent while the hook was away")
        .await;
    assert!(
        !raw_claim(&twin, "other", 0, 1).await.granted,
        "another replica was granted a place the streams still use"
    );
    drop(streams);
    counts_places(&twin, TOKEN_ENV, 0, Duration::from_secs(3), "the streams ended").await;
}
