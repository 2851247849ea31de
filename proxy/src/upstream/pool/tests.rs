//! The pool's choices, without a socket: models, roles, load, health and hand-overs.

use super::*;

/// Upstreams `u0`, `u1`, … with these model lists and roles.
fn pool_of(upstreams: impl IntoIterator<Item = (Option<Vec<String>>, Role)>) -> UpstreamPool {
    let eps: Vec<EndpointConfig> = upstreams
        .into_iter()
        .enumerate()
        .map(|(i, (models, role))| EndpointConfig {
            url: format!("http://u{i}:8000"),
            name: None,
            hook: None,
            models,
            role,
        })
        .collect();
    UpstreamPool::new(&eps, meridian_core::route::RoutingKind::PhaseAware.policy(1.25))
}

fn with_models(lists: &[Option<&[&str]>]) -> UpstreamPool {
    pool_of(lists.iter().map(|l| (l.map(|l| l.iter().map(|s| (*s).to_owned()).collect()), Role::default())))
}

#[test]
fn routes_by_model_and_treats_unknown_lists_as_eligible() {
    let m = Arc::new(Metrics::new());
    let p = with_models(&[Some(&["a"]), Some(&["b", "c"]), None]);
    for _ in 0..4 {
        let g = p.pick(Want::model(Some("a")), &[], &m).unwrap();
        assert_ne!(g.upstream().name, "u1:8000", "u1 does not serve a");
    }
    // The unknown upstream (u2) is eligible for anything; with it out, "z" has no home.
    assert_eq!(p.pick(Want::model(Some("z")), &[], &m).unwrap().upstream().name, "u2:8000");
    p.all()[2].set_discovered_models(vec!["d".into()]);
    assert_eq!(p.pick(Want::model(Some("z")), &[], &m).unwrap_err(), NoPick::ModelNotServed);
    assert_eq!(p.pick(Want::model(Some("c")), &[], &m).unwrap().upstream().name, "u1:8000");
    // Configured lists ignore discovery.
    assert!(!p.all()[0].set_discovered_models(vec!["x".into()]));
    assert_eq!(p.all()[0].serves("a"), Some(true));
    // The model's only server down: 503, not 404.
    p.all()[1].record_failure(1, &m, "test");
    assert_eq!(p.pick(Want::model(Some("c")), &[], &m).unwrap_err(), NoPick::NoHealthy);
    assert_eq!(p.known_models(), (vec!["a".into(), "b".into(), "c".into(), "d".into()], true));
}

#[test]
fn prefers_the_upstream_with_fewest_answering_streams_then_least_in_flight() {
    let m = Arc::new(Metrics::new());
    let p = pool(2);
    let (u0, u1) = (p.all()[0].clone(), p.all()[1].clone());
    // u0: one request, thinking; u1: one request, answering.
    let _a = p.pick(Want::model(None), &[], &m).unwrap();
    let _b = p.pick(Want::model(None), &[], &m).unwrap();
    u1.move_stream(Some(Phase::Think), Some(Phase::Output));
    assert_eq!(p.pick(Want::model(None), &[], &m).unwrap().upstream().name, "u0:8000");
    // Two thinking on u0 against one answering on u1: still u0.
    let _c = p.pick(Want::model(None), &[], &m).unwrap();
    assert_eq!(u0.in_flight(), 2);
    assert_eq!(p.pick(Want::model(None), &[], &m).unwrap().upstream().name, "u0:8000");
    // The answer ends: least in flight decides again.
    u1.move_stream(Some(Phase::Output), None);
    assert_eq!(u1.output_streams(), 0);
    assert_eq!(p.pick(Want::model(None), &[], &m).unwrap().upstream().name, "u1:8000");
    u1.move_stream(Some(Phase::Output), None);
    assert_eq!(u1.output_streams(), 0, "never below zero");
}

fn pool(n: usize) -> UpstreamPool {
    pool_of((0..n).map(|_| (None, Role::default())))
}

/// Upstreams `u0`, `u1`, … in these roles.
fn roles(roles: &[Role]) -> UpstreamPool {
    pool_of(roles.iter().map(|r| (None, *r)))
}

fn want(work: Work) -> Want<'static> {
    Want { model: None, affinity: None, work }
}

#[test]
fn roles_send_each_request_to_its_kind_of_upstream_and_fall_back_when_none_is_in_rotation() {
    let m = Arc::new(Metrics::new());
    let p = roles(&[Role::Think, Role::Answer, Role::Both]);
    for _ in 0..4 {
        let t = p.pick(want(Work::Think), &[], &m).unwrap();
        assert_ne!(t.upstream().name, "u1:8000", "thinking never goes to the answer server");
        let a = p.pick(want(Work::Answer), &[], &m).unwrap();
        assert_ne!(a.upstream().name, "u0:8000", "answers never go to the think server");
        let u = p.pick(want(Work::Unknown), &[], &m).unwrap();
        assert_eq!(u.upstream().name, "u2:8000", "unknown work goes to `both`");
    }
    // Every answer server out of rotation: an answer still goes somewhere.
    p.all()[1].record_failure(1, &m, "test");
    p.all()[2].record_failure(1, &m, "test");
    assert_eq!(p.pick(want(Work::Answer), &[], &m).unwrap().upstream().name, "u0:8000");
    // Saturated is not out of rotation: a thinking request waits for its own kind.
    p.all()[2].record_success(&m);
    let saturated = p.pick_where(want(Work::Think), &[], &m, |u| u.name != "u0:8000" && u.name != "u2:8000");
    assert_eq!(saturated.unwrap_err(), NoPick::Saturated);
}

#[test]
fn a_hand_over_goes_only_to_another_upstream_that_takes_answers_and_has_room() {
    let m = Arc::new(Metrics::new());
    let p = roles(&[Role::Think, Role::Think, Role::Answer, Role::Both]);
    assert!(p.hands_over() && !roles(&[Role::Both, Role::Answer]).hands_over());
    let from = p.all()[0].clone();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let to = p.hand_over("m", None, &from, &m, |_| true).unwrap();
        seen.insert(to.upstream().name.clone());
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["u2:8000", "u3:8000"], "never a think server");
    let room_only_on_u3 = p.hand_over("m", None, &from, &m, |u| u.name == "u3:8000").unwrap();
    assert_eq!(room_only_on_u3.upstream().name, "u3:8000");
    assert!(p.hand_over("m", None, &from, &m, |_| false).is_none(), "no room anywhere: it stays");
    assert_eq!(p.all()[2].in_flight() + p.all()[3].in_flight(), 1, "a declined hand-over holds nothing");
    p.all()[2].set_discovered_models(vec!["other".into()]);
    p.all()[3].record_failure(1, &m, "test");
    assert!(p.hand_over("m", None, &from, &m, |_| true).is_none(), "none serves the model in rotation");
}

#[test]
fn picks_least_loaded_and_releases_on_drop() {
    let m = Arc::new(Metrics::new());
    let p = pool(3);
    let a = p.pick(Want::model(None), &[], &m).unwrap();
    let b = p.pick(Want::model(None), &[], &m).unwrap();
    let c = p.pick(Want::model(None), &[], &m).unwrap();
    let names: std::collections::BTreeSet<_> =
        [&a, &b, &c].iter().map(|g| g.upstream().name.clone()).collect();
    assert_eq!(names.len(), 3, "each upstream gets one");
    let freed = b.upstream().clone();
    drop(b);
    assert_eq!(freed.in_flight(), 0);
    assert!(Arc::ptr_eq(p.pick(Want::model(None), &[], &m).unwrap().upstream(), &freed));
}

#[test]
fn skips_unhealthy_and_tried() {
    let m = Arc::new(Metrics::new());
    let p = pool(2);
    p.all()[0].record_failure(1, &m, "test");
    for _ in 0..4 {
        assert_eq!(p.pick(Want::model(None), &[], &m).unwrap().upstream().name, "u1:8000");
    }
    assert!(p.pick(Want::model(None), &[p.all()[1].clone()], &m).is_err());
    p.all()[0].record_success(&m);
    assert!(p.any_healthy());
    assert_eq!(p.pick(Want::model(None), &[p.all()[1].clone()], &m).unwrap().upstream().name, "u0:8000");
}
