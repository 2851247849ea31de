//! The holding this replica states at an engine whose hook answers again while requests
//! are being sent on this replica's own word, against a hook served here that records
//! every statement and can hold its answers back.

use std::sync::Arc;
use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use meridian_core::channel::{Claim, Granted, PLACES_PATH};
use tokio::sync::Notify;

use super::{EnginePlaces, PlaceTerms};
use crate::config::EndpointConfig;
use crate::share::Roster;
use crate::telemetry::Metrics;
use crate::upstream::Upstream;

/// A hook that grants every claim and records the holdings stated to it; it refuses the
/// channel (as a hook that cannot take claims) while `refusing`, and answers nothing
/// while the test holds `gate`.
#[derive(Default)]
struct Hook {
    stated: StdMutex<Vec<u32>>,
    refusing: AtomicBool,
    gate: tokio::sync::Mutex<()>,
}

impl Hook {
    fn stated(&self) -> Vec<u32> {
        self.stated.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits up to 2 s for a statement of `holding` after the first `after` statements.
    async fn states(&self, holding: u32, after: usize) -> bool {
        self.heard(|stated| stated.iter().skip(after).any(|&h| h == holding)).await
    }

    /// Waits up to 2 s for more than `after` statements (the last still unanswered).
    async fn hears(&self, after: usize) {
        assert!(self.heard(|stated| stated.len() > after).await, "the hook heard nothing");
    }

    async fn heard(&self, done: impl Fn(&[u32]) -> bool) -> bool {
        tokio::time::timeout(Duration::from_secs(2), async {
            while !done(&self.stated()) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .is_ok()
    }
}

async fn places(State(hook): State<Arc<Hook>>, Json(claim): Json<Claim>) -> Response {
    if let Ok(mut stated) = hook.stated.lock() {
        stated.push(claim.held);
    }
    let _answering = hook.gate.lock().await;
    if hook.refusing.load(Ordering::SeqCst) {
        return (StatusCode::NOT_FOUND, "no places here").into_response();
    }
    let held = claim.held + claim.want;
    Json(Granted { granted: true, held, total: held, ahead: 0, freed: 0, replicas: 1, rank: 0 })
        .into_response()
}

/// An upstream whose hook is `hook`, served on a port of its own, and this replica's terms.
async fn engine(hook: &Arc<Hook>) -> (Arc<Upstream>, String, Arc<PlaceTerms>) {
    let app =
        axum::Router::new().route(PLACES_PATH, axum::routing::post(places)).with_state(Arc::clone(hook));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a port for the hook");
    let addr = listener.local_addr().expect("the hook's address").to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let upstream = Arc::new(Upstream::new(&EndpointConfig {
        url: "http://127.0.0.1:1".into(),
        name: None,
        hook: Some(addr.clone()),
        models: None,
        role: Default::default(),
    }));
    let terms = Arc::new(PlaceTerms {
        channel: crate::hook::HookChannel::with_secret("s", Duration::from_secs(5)),
        holder: "replica-0".into(),
        limit: 4,
        metrics: Arc::new(Metrics::new()),
        waits: false,
        roster: Arc::new(Roster::default()),
    });
    (upstream, addr, terms)
}

/// The replica decides the engine's room alone: its hook refused the channel.
async fn alone_at(upstream: &Upstream, addr: &str, terms: &PlaceTerms, hook: &Hook) {
    hook.refusing.store(true, Ordering::SeqCst);
    upstream.places.renew(terms, addr).await;
    assert!(upstream.places.alone(), "a hook that refuses the channel leaves the replica alone");
    hook.refusing.store(false, Ordering::SeqCst);
}

#[tokio::test]
async fn a_place_taken_alone_while_the_answer_that_ends_the_spell_is_on_its_way_is_stated_after_it() {
    let hook = Arc::new(Hook::default());
    let (upstream, addr, terms) = engine(&hook).await;
    alone_at(&upstream, &addr, &terms, &hook).await;
    let before = hook.stated().len();

    // A renewal reaches the hook, which is answering again; its answer is held back.
    let gate = hook.gate.lock().await;
    let renewal = {
        let (upstream, addr, terms) = (Arc::clone(&upstream), addr.clone(), Arc::clone(&terms));
        tokio::spawn(async move { upstream.places.renew(&terms, &addr).await })
    };
    hook.hears(before).await;
    assert_eq!(hook.stated()[before..], [0], "the renewal read the holding before the place was taken");

    // Meanwhile a request, finding the replica still alone, takes its place on its own word.
    assert!(upstream.places.alone());
    let place = EnginePlaces::taken_alone(&upstream, &addr, &terms, &Arc::new(Notify::new()));
    drop(gate);
    renewal.await.expect("the renewal ends");
    assert!(!upstream.places.alone(), "the answer ends the spell alone");

    // The engine hears of the place at once, not a renewal period later.
    assert!(
        hook.states(1, before + 1).await,
        "the engine was never told of the place taken alone: it heard {:?}",
        hook.stated()
    );
    drop(place);
}

#[tokio::test]
async fn a_place_taken_alone_just_after_the_hook_answered_again_is_stated_at_once() {
    let hook = Arc::new(Hook::default());
    let (upstream, addr, terms) = engine(&hook).await;
    alone_at(&upstream, &addr, &terms, &hook).await;
    upstream.places.renew(&terms, &addr).await;
    assert!(!upstream.places.alone(), "the hook answers again");
    let before = hook.stated().len();

    // A request that found the replica alone just before that renewal takes its place now.
    let place = EnginePlaces::taken_alone(&upstream, &addr, &terms, &Arc::new(Notify::new()));
    assert!(
        hook.states(1, before).await,
        "the engine was never told of the place taken alone: it heard {:?}",
        hook.stated()
    );

    // Given back, the place leaves the holding the engine hears.
    let told = hook.stated().len();
    drop(place);
    assert!(hook.states(0, told).await, "the place given back was never reported: {:?}", hook.stated());
}

#[tokio::test]
async fn a_renewal_asked_for_while_one_is_under_way_states_the_holding_once_more_after_it() {
    let hook = Arc::new(Hook::default());
    let (upstream, addr, terms) = engine(&hook).await;
    upstream.places.renew(&terms, &addr).await;
    let before = hook.stated().len();

    // The periodic renewal is under way, its answer held back.
    let gate = hook.gate.lock().await;
    EnginePlaces::renew_in_background(&upstream, &addr, &terms);
    hook.hears(before).await;
    // A second periodic renewal is skipped while the first is out...
    EnginePlaces::renew_in_background(&upstream, &addr, &terms);
    // ...but a restatement is not: it follows the renewal under way.
    upstream.places.taken_alone.fetch_add(1, Ordering::SeqCst);
    EnginePlaces::restate(&upstream, &addr, &terms);
    drop(gate);
    assert!(hook.states(1, before).await, "the restatement was lost: {:?}", hook.stated());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(hook.stated()[before..], [0, 1], "one renewal, then one restatement, and no more");
}
