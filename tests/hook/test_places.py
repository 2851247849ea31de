"""The hook's listener grants proxy replicas the places of the engine's limit
(`admission.places = "engine"`, ADR 0013): a replica claims a place before it sends a
request, stating how many it holds; the engine grants while every replica's places, the
new one included, stay within the limit, and a replica's report after its requests end
frees its places for the others at once."""

from __future__ import annotations

import json
import urllib.request

from conftest import metric
from meridian_hook.testing import build

from meridian_hook import PROTOCOL_VERSION
from meridian_hook.scheduler import MeridianScheduler

SECRET = "places-test-secret"


def claims(outcome: str) -> float:
    return metric(f'meridian_hook_place_claims_total{{outcome="{outcome}"}}')


def test_replicas_get_the_engines_places_in_turn_and_never_more_than_the_limit(tmp_path, monkeypatch):
    cfg = tmp_path / "meridian.toml"
    cfg.write_text('[hook]\npolicy = "fcfs"\nlisten = "127.0.0.1:0"\n')
    monkeypatch.setenv("MERIDIAN_HOOK_CONFIG", str(cfg))
    monkeypatch.setenv("MERIDIAN_HOOK_TOKEN", SECRET)
    build(MeridianScheduler, num_blocks=64)
    from meridian_hook.runtime import runtime

    address = runtime().start_listener()

    def claim(holder: str, held: int, want: int) -> dict:
        body = {"holder": holder, "held": held, "want": want, "limit": 2, "lease_s": 30.0}
        request = urllib.request.Request(
            f"http://{address}/meridian/v1/places", data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {SECRET}", "meridian-protocol": str(PROTOCOL_VERSION),
                     "Content-Type": "application/json"},
        )
        return json.loads(urllib.request.urlopen(request, timeout=5).read())

    before = {o: claims(o) for o in ("granted", "refused", "reported")}
    # Replica a takes both places while b is idle: places go by need.
    assert claim("a", 0, 1) == {"granted": True, "held": 1, "total": 1, "ahead": 0}
    assert claim("a", 1, 1) == {"granted": True, "held": 2, "total": 2, "ahead": 0}
    # b finds them held.
    assert claim("b", 0, 1) == {"granted": False, "held": 0, "total": 2, "ahead": 0}
    # One of a's requests ends; its report frees the place, and b takes it.
    assert claim("a", 1, 0) == {"granted": True, "held": 1, "total": 1, "ahead": 0}
    assert claim("b", 0, 1) == {"granted": True, "held": 1, "total": 2, "ahead": 0}
    assert claim("a", 1, 1)["granted"] is False
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
    assert claim("b", 1, 0) == {"granted": True, "held": 1, "total": 2, "ahead": 0}
