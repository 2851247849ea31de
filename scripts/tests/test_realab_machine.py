"""How busy the rig's processes were during a run (scripts/realab/machine.py), and the
page's table of it (policies.delivery_core): the figures that show whether the delivery
path (API server, proxy, load tester) was starved of CPU."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest


from realab import machine, policies


def test_a_child_is_counted_under_its_role_with_the_cpu_it_took():
    before = machine.sample()
    # A busy child whose command line reads like the proxy's.
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nt = time.time()\nwhile time.time() - t < 0.6: pass",
                              "meridian serve"])
    try:
        time.sleep(0.3)
        during = machine.sample()
        assert child.pid in during.roles
        assert during.roles[child.pid][0] == "proxy"
    finally:
        child.wait(timeout=30)
    got = machine.between(before, during)
    assert got["roles"]["proxy"]["cores"] > 0
    assert got["roles"]["proxy"]["waiting"] >= 0
    assert got["ours_cores"] > 0


def test_between_charges_each_role_its_own_processes_only():
    a = machine.Sample(wall=0.0, busy=0.0, steal=0.0, ours=0.0,
                       roles={1: ("engine core", 5.0, 1.0), 2: ("proxy", 1.0, 0.0), 4: ("API server", 9.0, 9.0)})
    # Over 2 s the engine core ran 1.6 s and waited 0.4 s; a second proxy appeared and
    # ran 0.2 s, the first 0.2 s more; a process gone meanwhile is left out.
    b = machine.Sample(wall=2.0, busy=4.0, steal=0.0, ours=3.0,
                       roles={1: ("engine core", 6.6, 1.4), 2: ("proxy", 1.2, 0.1), 3: ("proxy", 0.2, 0.3)})
    roles = machine.between(a, b)["roles"]
    assert roles["engine core"] == pytest.approx({"cores": 0.8, "waiting": 0.2})
    assert roles["proxy"] == pytest.approx({"cores": 0.2, "waiting": 0.2})
    assert "API server" not in roles


def test_the_page_tables_each_configuration_by_its_median_run():
    def run(config, proxy_wait):
        return {"config": config, "cpu": {"roles": {"engine core": {"cores": 0.25, "waiting": 0.2},
                                                    "proxy": {"cores": 0.03, "waiting": proxy_wait}}}}
    data = {"setup": {"configs": ["stock", "proxy", "hook"]},
            "runs": [run("proxy", 0.04), run("proxy", 0.06), run("proxy", 0.5), {"config": "stock", "cpu": {}}]}
    lines = policies.delivery_core(data)
    row = next(line for line in lines if line.startswith("| `proxy`"))
    assert row == "| `proxy` | 3 | 0.25 (0.20) | 0.03 (0.06) |"
    # Configurations without counted runs get no row; no counted run at all, no table.
    assert not any(line.startswith("| `stock`") for line in lines)
    assert policies.delivery_core({"setup": {"configs": ["stock"]}, "runs": [{"config": "stock"}]}) == []
