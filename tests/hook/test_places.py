"""The hook's listener grants proxy replicas the places of the engine's limit
(`admission.places = "engine"`, ADR 0013): a replica claims a place before it sends a
request, stating how many it holds; the engine grants while every replica's places, the
new one included, stay within the limit, and a replica's report after its requests end
frees its places for the others at once."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

from conftest import metric
from meridian_hook.testing import build

from meridian_hook import PROTOCOL_VERSION
from meridian_hook.scheduler import MeridianScheduler

SECRET = "places-test-secret"


def claims(outcome: str) -> float:
    return metric(f'meridian_hook_place_claims_total{{outcome="{outcome}"}}')


def waits(outcome: str) -> float:
    return metric(f'meridian_hook_place_waits_total{{outcome="{outcome}"}}')


def listener(tmp_path, monkeypatch) -> str:
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[hook]\npolicy = "fcfs"\nlisten = "127.0.0.1:0"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    monkeypatch.setenv("MERIDIAN_HOOK_TOKEN", SECRET)
    build(MeridianScheduler, num_blocks=64)
    from meridian_hook.runtime import runtime

    return runtime().start_listener()


def post(address: str, path: str, body: dict, timeout: float = 5) -> dict:
    request = urllib.request.Request(
        f"http://{address}{path}", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {SECRET}", "meridian-protocol": str(PROTOCOL_VERSION),
                 "Content-Type": "application/json"},
    )
    return json.loads(urllib.request.urlopen(request, timeout=timeout).read())


def claimer(address: str, limit: int = 2):
    def claim(holder: str, held: int, want: int, lease_s: float = 30.0, waited_s: float = 0.0) -> dict:
        body = {"holder": holder, "held": held, "want": want, "limit": limit, "lease_s": lease_s,
                "waited_s": waited_s}
        return post(address, "/meridian/v1/places", body)
    return claim


def test_replicas_get_the_engines_places_in_turn_and_never_more_than_the_limit(tmp_path, monkeypatch):
    address = listener(tmp_path, monkeypatch)
    claim = claimer(address)

    before = {o: claims(o) for o in ("granted", "refused", "reported")}
    # Replica a takes both places while b is idle: places go by need.
    def answer(holder: str, held: int, want: int) -> dict:
        # The count of openings is checked apart: a turn left stale on a slow machine
        # (a refused claim not asked again within 250 ms) counts as one too.
        got = claim(holder, held, want)
        counts.append(got.pop("freed"))
        rosters[holder] = (got.pop("replicas"), got.pop("rank"))
        return got

    counts: list[int] = []
    rosters: dict[str, tuple[int, int]] = {}
    assert answer("a", 0, 1) == {"granted": True, "held": 1, "total": 1, "ahead": 0}
    assert answer("a", 1, 1) == {"granted": True, "held": 2, "total": 2, "ahead": 0}
    # b finds them held.
    assert answer("b", 0, 1) == {"granted": False, "held": 0, "total": 2, "ahead": 0}
    refused_at = counts[-1]
    # One of a's requests ends; its report frees the place (the count of openings
    # moves), and b takes it.
    assert answer("a", 1, 0) == {"granted": True, "held": 1, "total": 1, "ahead": 0}
    assert counts[-1] > refused_at and counts == sorted(counts)
    assert answer("b", 0, 1) == {"granted": True, "held": 1, "total": 2, "ahead": 0}
    assert claim("a", 1, 1)["granted"] is False
    # Every answer says how many replicas the engine has heard from within their leases
    # (a and b, and any an earlier test left on the roster) and where each stands by name.
    (a_count, a_rank), (b_count, b_rank) = rosters["a"], rosters["b"]
    assert a_count == b_count >= 2 and a_rank < b_rank < b_count
    after = {o: claims(o) for o in ("granted", "refused", "reported")}
    assert {o: after[o] - before[o] for o in after} == {"granted": 3, "refused": 2, "reported": 1}

    # A claim that is not one is refused and named, and changes nothing.
    bad = urllib.request.Request(
        f"http://{address}/meridian/v1/places", data=b'{"holder": "c", "held": 0}', method="POST",
        headers={"Authorization": f"Bearer {SECRET}", "meridian-protocol": str(PROTOCOL_VERSION)},
    )
    try:
        urllib.request.urlopen(bad, timeout=5)
        raise AssertionError("a claim without its fields was taken")
    except urllib.error.HTTPError as e:
        assert e.code == 400 and "missing field" in e.read().decode()
    assert answer("b", 1, 0) == {"granted": True, "held": 1, "total": 2, "ahead": 0}
    # Both leave the table, for the next test.
    claim("a", 0, 0)
    claim("b", 0, 0)


def test_a_refused_replicas_wait_is_held_until_a_place_frees(tmp_path, monkeypatch):
    address = listener(tmp_path, monkeypatch)
    claim = claimer(address)
    before = {o: waits(o) for o in ("woken", "expired")}
    assert claim("a", 0, 2)["granted"]
    refused = claim("b", 0, 1)
    assert refused["granted"] is False
    wait = {"after": refused["freed"], "wait_s": 4.0}

    answered: dict = {}

    def waiter():
        answered.update(post(address, "/meridian/v1/places/wait", wait, timeout=10))
        answered["at"] = time.monotonic()

    thread = threading.Thread(target=waiter)
    thread.start()
    # Nothing frees: the wait is held, and the listener still answers others. b asks
    # again every 0.1 s meanwhile, as a replica does, which keeps its turn.
    for _ in range(3):
        time.sleep(0.1)
        assert claim("b", 0, 1)["granted"] is False
    assert not answered, f"answered before any place freed: {answered}"
    released = time.monotonic()
    claim("a", 1, 0)
    thread.join(timeout=5)
    assert answered["freed"] > refused["freed"]
    assert answered["at"] - released < 2.0, "woken by the release, not by the wait's end"
    assert claim("b", 0, 1)["granted"]

    # A wait whose time runs out with nothing freed is answered with the count as it was.
    t0 = time.monotonic()
    assert post(address, "/meridian/v1/places/wait", {"after": answered["freed"], "wait_s": 0.3}) == {
        "freed": answered["freed"], "woken": False}
    assert time.monotonic() - t0 >= 0.3
    # A count passed already is answered at once.
    t0 = time.monotonic()
    assert post(address, "/meridian/v1/places/wait", {"after": 0, "wait_s": 4.0})["freed"] > 0
    assert time.monotonic() - t0 < 2.0
    after = {o: waits(o) for o in ("woken", "expired")}
    assert after["woken"] - before["woken"] == 1 and after["expired"] - before["expired"] == 1

    # A replica that died wakes the waiters when its lease lapses, with no message at all.
    claim("a", 0, 0)
    claim("b", 0, 0)
    assert claim("gone", 0, 2, lease_s=0.5)["granted"]
    refused = claim("b", 0, 1)
    assert refused["granted"] is False
    t0 = time.monotonic()
    # b waits, and asks again each time it is woken (its own turn going stale wakes it
    # too: an opening for any other waiter), as a replica does, until it is granted.
    answer = refused
    while not answer["granted"]:
        assert time.monotonic() - t0 < 3.5, "the lapse woke no one"
        post(address, "/meridian/v1/places/wait", {"after": answer["freed"], "wait_s": 4.0}, timeout=10)
        answer = claim("b", 0, 1)
    assert time.monotonic() - t0 >= 0.4, "granted before gone's lease ran out"
    claim("b", 0, 0)


def test_a_freed_place_wakes_only_the_replica_whose_turn_it_keeps(tmp_path, monkeypatch):
    """Several replicas wait for a full engine: a place that frees is kept for the
    request that has waited longest, so the engine wakes that replica alone; the others
    would ask only to be refused (the thundering herd the fleet bench measured)."""
    address = listener(tmp_path, monkeypatch)
    claim = claimer(address)
    # Each replica states how long its request has waited, as a replica does: b's longest.
    waited = {"b": 10.0, "c": 5.0}
    assert claim("a", 0, 2)["granted"]
    refused = {h: claim(h, 0, 1, waited_s=w) for h, w in waited.items()}
    assert [r["granted"] for r in refused.values()] == [False, False]
    assert refused["c"]["ahead"] == 1, "b's request goes first"
    answered: dict[str, dict] = {}

    def waiter(holder: str) -> None:
        body = {"after": refused[holder]["freed"], "wait_s": 4.0, "holder": holder}
        answered[holder] = post(address, "/meridian/v1/places/wait", body, timeout=10)

    threads = {h: threading.Thread(target=waiter, args=(h,)) for h in waited}
    for t in threads.values():
        t.start()

    def keep_turns(seconds: float) -> None:
        # Replicas ask again every 0.1 s while they wait, which keeps their turns.
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for h in waited:
                if h not in answered:
                    assert claim(h, 0, 1, waited_s=waited[h])["granted"] is False
            time.sleep(0.1)

    keep_turns(0.2)
    assert not answered, f"answered before any place freed: {answered}"
    # One of a's requests ends: b is woken, c is not.
    claim("a", 1, 0)
    threads["b"].join(timeout=5)
    assert answered["b"]["woken"] is True
    assert claim("b", 0, 1, waited_s=waited["b"])["granted"]
    keep_turns(0.2)
    assert "c" not in answered, f"c woken for the place kept for b: {answered}"
    # a's other request ends: now c's turn.
    claim("a", 0, 0)
    threads["c"].join(timeout=5)
    assert answered["c"]["woken"] is True
    assert claim("c", 0, 1, waited_s=waited["c"])["granted"]
    for h in ("b", "c"):
        claim(h, 0, 0)


def test_a_replica_withdraws_its_turn_when_its_request_got_a_place_elsewhere(tmp_path, monkeypatch):
    """A replica refused here whose request then got a place at another engine withdraws
    its turn: the place that frees next goes to the replica still waiting, at once, not
    after the withdrawn turn would have gone stale."""
    address = listener(tmp_path, monkeypatch)
    claim = claimer(address, limit=1)
    assert claim("a", 0, 1)["granted"]
    assert not claim("b", 0, 1, waited_s=10.0)["granted"]
    refused = claim("c", 0, 1, waited_s=5.0)
    assert refused["ahead"] == 1, "b's request goes first"
    # b's request was granted elsewhere; b withdraws its turn here (a plain report would not).
    assert claim("b", 0, 0)["granted"]
    assert claim("c", 0, 1, waited_s=5.0)["ahead"] == 1, "a report keeps b's turn"
    withdrawn = post(address, "/meridian/v1/places", {"holder": "b", "held": 0, "want": 0, "limit": 1,
                                                     "lease_s": 30.0, "withdraw": True})
    assert withdrawn["granted"] and withdrawn["freed"] > refused["freed"], "the withdrawal opens the kept turn"
    assert claim("c", 0, 1, waited_s=5.0)["ahead"] == 0
    # a's request ends: the place is c's.
    claim("a", 0, 0)
    assert claim("c", 0, 1, waited_s=5.0)["granted"]
    claim("c", 0, 0)
