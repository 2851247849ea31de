//! The listener and a follower in one test process (each with its own `Shared`, as the
//! engine core and a worker have): directives reach the follower at once through its
//! long poll, and an idle channel is polled about once per hold, not continuously.

use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_core::channel::{Action, Directive};

use super::{ChannelServer, Follower, Shared, hello};
use crate::metrics::Counter;

const SECRET: &str = "test-secret";

fn pair() -> (ChannelServer, Arc<Shared>, Follower, Arc<Shared>) {
    let engine = Arc::new(Shared::default());
    let server =
        ChannelServer::start("127.0.0.1:0", SECRET.into(), hello("fcfs", false, true), Arc::clone(&engine))
            .expect("listener starts");
    let worker = Arc::new(Shared::default());
    let follower = Follower::start(server.addr.to_string(), SECRET.into(), "worker-test".into(), Arc::clone(&worker))
        .expect("follower starts");
    (server, engine, follower, worker)
}

fn end_thinking(id: &str) -> Directive {
    Directive { request_id: id.into(), action: Action::EndThinking }
}

/// Waits until `done` holds, up to `limit`; returns how long it took.
fn within(limit: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

#[test]
fn a_directive_reaches_a_waiting_follower_before_its_poll_would_end() {
    let (_server, engine, _follower, worker) = pair();
    // Let the follower's first poll catch up and settle into a held one.
    within(Duration::from_secs(5), || engine.counters.get(Counter::ChannelOk) >= 1).expect("follower syncs");
    std::thread::sleep(Duration::from_millis(200));
    engine.apply_directives([end_thinking("req-1")]).expect("table");
    let took = within(Duration::from_secs(5), || {
        worker.directives_for("req-1").is_some_and(|d| d.end_thinking)
    })
    .expect("the follower learns the directive");
    // Far less than the one-second hold: the held reply was answered by the directive.
    assert!(took < Duration::from_millis(500), "took {took:?}");
}

#[test]
fn an_idle_channel_is_polled_about_once_a_hold_not_continuously() {
    let (_server, engine, _follower, _worker) = pair();
    within(Duration::from_secs(5), || engine.counters.get(Counter::ChannelOk) >= 1).expect("follower syncs");
    let before = engine.counters.get(Counter::ChannelOk);
    std::thread::sleep(Duration::from_millis(2500));
    let polls = engine.counters.get(Counter::ChannelOk) - before;
    // A one-second hold gives 2 or 3 polls in 2.5 s; the old 10 ms poll gave ~200.
    assert!((1..=5).contains(&polls), "{polls} polls in 2.5 s");
}

#[test]
fn a_sync_that_finds_directives_is_answered_at_once_with_them() {
    let engine = Arc::new(Shared::default());
    engine.apply_directives([end_thinking("a"), end_thinking("b")]).expect("table");
    let start = Instant::now();
    let reply = engine.directives_after(0, Duration::from_secs(1)).expect("table");
    assert!(start.elapsed() < Duration::from_millis(100));
    assert_eq!(reply.directives.len(), 2);
    // Nothing after the latest: the wait runs out and the reply is empty.
    let start = Instant::now();
    let reply = engine.directives_after(reply.seq, Duration::from_millis(150)).expect("table");
    assert!(start.elapsed() >= Duration::from_millis(140));
    assert!(reply.directives.is_empty());
}
