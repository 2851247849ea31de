"""Traces over OTLP, end to end: the real `meridian` binary exports to a real OTLP
receiver (HTTP/protobuf, decoded with the official `opentelemetry-proto` messages, and
gRPC through grpcio), in front of a small upstream that records the headers it gets.

Checked: the request span is the child of the client's `traceparent`; the admission
wait, the upstream attempt and the continuation leg are children of the request span;
think start, think end and the first visible token are events on it, in that order, with
token counts; the GenAI attribute names are there; the upstream received a `traceparent`
in the same trace whose parent is the attempt (or leg) span; spans queued at shutdown are
flushed; JSON logs carry the trace and span ids; with tracing off the client's
`traceparent` reaches the upstream unchanged."""

import os
import socket
import subprocess
import time

import pytest
import requests

from conftest import binary
from tracing_rig import (
    CLIENT, ERROR, MODEL, REASONING, SERVER, Certs, GrpcReceiver, Hook, HttpReceiver, Proxy, Upstream, by_name,
    parent_of, stream_chat, traceparent, traced,
)


# ---------- the tests ----------


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_request_span_tree_events_and_propagation(protocol):
    # Admission on, with room: the wait is a span even when it is short.
    with traced("admission.enabled=true", "admission.max_streams=8", protocol=protocol) as rig:
        trace_id, client_span, header = traceparent()
        stream_chat(rig.proxy.url, {"traceparent": header, "x-request-id": "trace-me"},
                    {"stream_options": {"include_usage": True}})
        spans = rig.request_spans()
    receiver, upstream = rig.receiver, rig.upstream

    ours = [s for s in spans if s["trace_id"] == trace_id]
    assert len(ours) == len(spans), "every span of the request is in the client's trace"
    [request] = by_name(ours, f"chat {MODEL}")
    assert request["parent"] == client_span, "the request span is the child of the client's span"
    assert request["kind"] == SERVER
    a = request["attrs"]
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == MODEL
    assert a["gen_ai.usage.input_tokens"] == 7
    assert a["gen_ai.usage.output_tokens"] == 7
    assert a["gen_ai.usage.reasoning.output_tokens"] == len(REASONING)
    assert a["meridian.request_id"] == "trace-me" and a["meridian.outcome"] == "ok"
    assert a["http.response.status_code"] == 200 and a["meridian.ttot_ms"] >= 0

    events = request["events"]
    assert [e["name"] for e in events] == ["think_start", "think_end", "first_visible_token"]
    assert events[0]["time"] <= events[1]["time"] <= events[2]["time"]
    assert events[0]["attrs"]["meridian.think_tokens"] == 1
    assert events[1]["attrs"]["meridian.think_tokens"] == len(REASONING)
    assert events[2]["attrs"]["meridian.think_tokens"] == len(REASONING)
    assert events[2]["attrs"]["meridian.output_tokens"] == 1
    assert request["start"] <= events[0]["time"] and events[2]["time"] <= request["end"]

    [admission] = by_name(ours, "admission wait")
    assert admission["parent"] == request["span_id"]
    assert admission["attrs"]["meridian.admission.class"] == "interactive"
    [attempt] = by_name(ours, "upstream attempt")
    assert attempt["parent"] == request["span_id"] and attempt["kind"] == CLIENT
    assert attempt["attrs"]["meridian.attempt"] == 0 and attempt["attrs"]["http.response.status_code"] == 200
    # The attempt lasts as long as the upstream's response, inside the request.
    assert request["start"] <= attempt["start"] and attempt["end"] <= request["end"]
    assert attempt["end"] >= events[2]["time"]

    [sent] = upstream.requests
    assert parent_of(sent["headers"]["traceparent"]) == (trace_id, attempt["span_id"]), (
        "the upstream joins the trace under the attempt span")
    assert receiver.spans.resources[0]["service.name"] == "meridian"


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_collector_over_tls(protocol, tmp_path):
    certs = Certs(tmp_path)
    receiver = HttpReceiver(certs) if protocol == "http/protobuf" else GrpcReceiver(certs)
    with traced(protocol=protocol, receiver=receiver, env={"SSL_CERT_FILE": str(certs.ca)}) as rig:
        trace_id, _, header = traceparent()
        stream_chat(rig.proxy.url, {"traceparent": header})
        spans = rig.request_spans()
    assert receiver.endpoint.startswith("https://")
    assert {s["trace_id"] for s in spans} == {trace_id}


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_proxy_starts_a_trace_when_the_client_sends_none_and_flushes_at_exit(protocol):
    receiver = HttpReceiver() if protocol == "http/protobuf" else GrpcReceiver()
    upstream = Upstream()
    # The default batch delay (5 s) outlasts the test: the spans leave at shutdown. The
    # collector comes from the standard variables alone.
    proxy = Proxy(upstream.url, [
        "telemetry.tracing.enabled=true", "telemetry.tracing.service_name=edge-proxy",
    ], env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol})
    try:
        stream_chat(proxy.url, {})
        assert not receiver.spans.items, "nothing exported before the batch delay or shutdown"
        proxy.stop()
        assert proxy.proc.returncode == 0, "".join(proxy.log)
        spans = receiver.spans.wait_for(lambda s: any(x["name"] == "upstream attempt" for x in s), timeout=5)
    finally:
        proxy.stop()
        upstream.stop()
        receiver.stop()
    [request] = by_name(spans, f"chat {MODEL}")
    assert request["parent"] == "", "no client context: the request span is the root"
    [attempt] = by_name(spans, "upstream attempt")
    assert parent_of(upstream.requests[0]["headers"]["traceparent"]) == (request["trace_id"], attempt["span_id"])
    assert receiver.spans.resources[0]["service.name"] == "edge-proxy"


@pytest.mark.parametrize("config", [[], ["telemetry.tracing.enabled=false"]], ids=["unset", "off"])
def test_the_standard_variables_alone_turn_traces_on_unless_the_config_says_off(config):
    # As for any other OpenTelemetry service: OTEL_TRACES_EXPORTER=otlp and an endpoint,
    # nothing in meridian.toml. The config's `enabled = false` still wins.
    receiver = HttpReceiver()
    upstream = Upstream()
    proxy = Proxy(upstream.url, config, env={
        "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "100",
    })
    try:
        stream_chat(proxy.url, {})
        proxy.stop()
        assert proxy.proc.returncode == 0, "".join(proxy.log)
        if config:
            time.sleep(0.5)
            assert receiver.spans.items == [], "telemetry.tracing.enabled=false keeps traces off"
        else:
            spans = receiver.spans.wait_for(lambda s: any(x["name"] == "upstream attempt" for x in s), timeout=5)
            assert by_name(spans, f"chat {MODEL}"), "the request's span arrived"
    finally:
        proxy.stop()
        upstream.stop()
        receiver.stop()


def test_continuation_leg_is_a_span_and_carries_its_own_traceparent():
    # Thinking outlasts the 0.3 s time budget; no hook, so the proxy continues the stream.
    upstream = Upstream(gap_s=0.1, think_chunks=[f" step{i}" for i in range(40)])
    with traced("budget.think_seconds=0.3", upstream=upstream) as rig:
        trace_id, _, header = traceparent()
        stream_chat(rig.proxy.url, {"traceparent": header})
        spans = rig.request_spans()
    [request] = by_name(spans, f"chat {MODEL}")
    [attempt] = by_name(spans, "upstream attempt")
    [leg] = by_name(spans, "continuation leg")
    assert leg["parent"] == request["span_id"] and leg["trace_id"] == trace_id
    assert leg["attrs"]["meridian.continuation.reason"] == "budget_seconds"
    assert leg["attrs"]["http.response.status_code"] == 200
    first, second = upstream.requests
    assert second["body"].get("continue_final_message") is True
    assert parent_of(first["headers"]["traceparent"]) == (trace_id, attempt["span_id"])
    assert parent_of(second["headers"]["traceparent"]) == (trace_id, leg["span_id"])
    names = [e["name"] for e in request["events"]]
    assert names == ["think_start", "think_end", "first_visible_token"], names


def test_hook_directives_are_spans_under_the_request():
    hook = Hook()
    # Thinking outlasts the 0.2 s time budget: the proxy tells the hook to end it, and
    # to forget the request once it is over.
    upstream = Upstream(gap_s=0.05, think_chunks=[f" step{i}" for i in range(12)])
    with traced("budget.think_seconds=0.2", upstream=upstream, hook=hook,
                env={"MERIDIAN_HOOK_TOKEN": "s3cret"}) as rig:
        trace_id, _, header = traceparent()
        stream_chat(rig.proxy.url, {"traceparent": header})
        spans = rig.receiver.spans.wait_for(lambda s: sum(x["name"].startswith("hook ") for x in s) >= 2)
    assert [d["action"] for d in hook.directives] == ["end_thinking", "forget"], hook.directives
    [request] = by_name(spans, f"chat {MODEL}")
    [attempt] = by_name(spans, "upstream attempt")
    assert attempt["attrs"]["meridian.via_hook"] is True
    for action in ("end_thinking", "forget"):
        [d] = by_name(spans, f"hook {action}")
        assert d["parent"] == request["span_id"] and d["trace_id"] == trace_id
        assert d["attrs"]["meridian.hook.action"] == action and d["attrs"]["meridian.hook.addr"] == hook.addr
        assert d["kind"] == CLIENT and d["status"] != ERROR


def test_json_logs_carry_the_ids_of_the_exported_spans():
    with traced() as rig:
        trace_id, _, header = traceparent()
        stream_chat(rig.proxy.url, {"traceparent": header})
        spans = rig.request_spans()
    proxy = rig.proxy
    [request] = by_name(spans, f"chat {MODEL}")
    finished = [line for line in proxy.json_logs() if line.get("message") == "request finished"]
    assert len(finished) == 1, proxy.log
    line = finished[0]
    assert line["trace_id"] == trace_id and line["span_id"] == request["span_id"], line
    assert line["level"] == "INFO" and line["outcome"] == "ok" and "timestamp" in line
    # The span events are for traces, not logs.
    assert not any(line.get("message") in ("think_start", "first_visible_token") for line in proxy.json_logs())


def test_tracing_off_passes_the_client_traceparent_through_unchanged():
    upstream = Upstream()
    proxy = Proxy(upstream.url)
    try:
        _, _, header = traceparent()
        stream_chat(proxy.url, {"traceparent": header, "tracestate": "vendor=1"})
    finally:
        proxy.stop()
        upstream.stop()
    [sent] = upstream.requests
    assert sent["headers"]["traceparent"] == header and sent["headers"]["tracestate"] == "vendor=1"
    finished = [line for line in proxy.json_logs() if line.get("message") == "request finished"]
    assert finished and "trace_id" not in finished[0], "no ids without traces"


def test_otel_sdk_disabled_turns_tracing_off_and_the_context_passes_through():
    with traced(env={"OTEL_SDK_DISABLED": "true"}) as rig:
        _, _, header = traceparent()
        stream_chat(rig.proxy.url, {"traceparent": header})
    proxy, receiver, upstream = rig.proxy, rig.receiver, rig.upstream
    assert proxy.proc.returncode == 0
    assert receiver.spans.items == [], "no exporter with OTEL_SDK_DISABLED=true"
    assert upstream.requests[0]["headers"]["traceparent"] == header


def test_an_unsupported_protocol_variable_stops_the_start_naming_it():
    out = subprocess.run(
        [str(binary("meridian")), "serve", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9",
         "--set", "telemetry.tracing.enabled=true"],
        env={**os.environ, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 2, out
    assert "OTEL_EXPORTER_OTLP_PROTOCOL" in out.stderr and "http/json" in out.stderr, out.stderr


def test_sample_ratio_zero_keeps_only_traces_the_client_sampled():
    with traced("telemetry.tracing.sample_ratio=0") as rig:
        stream_chat(rig.proxy.url, {})  # a new trace: dropped at ratio 0
        trace_id, _, header = traceparent()
        stream_chat(rig.proxy.url, {"traceparent": header})  # the client sampled it: kept
        spans = rig.request_spans()
        time.sleep(0.5)
    receiver, upstream = rig.receiver, rig.upstream
    assert {s["trace_id"] for s in receiver.spans.items} == {trace_id}, spans
    unsampled, sampled = (r["headers"]["traceparent"] for r in upstream.requests)
    assert unsampled.endswith("-00"), "the drop decision travels upstream too"
    assert sampled.split("-")[1] == trace_id and sampled.endswith("-01")


def test_a_client_that_leaves_before_the_response_ends_the_span_so_marked():
    with traced(upstream=Upstream(head_delay_s=1.0)) as rig:
        trace_id, _, header = traceparent()
        body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        with pytest.raises(requests.exceptions.ReadTimeout):
            requests.post(f"{rig.proxy.url}/v1/chat/completions", json=body, headers={"traceparent": header},
                          timeout=0.3)
        spans = rig.request_spans()
    [request] = by_name(spans, f"chat {MODEL}")
    assert request["trace_id"] == trace_id
    assert request["attrs"]["meridian.outcome"] == "client_disconnected"
    assert request["status"] != ERROR, "a client that left is not the proxy's failure"


def test_an_upstream_that_goes_silent_fails_the_spans_and_its_warning_joins_the_trace():
    with traced("upstream.idle_timeout_s=0.5", upstream=Upstream(stall_after=3)) as rig:
        trace_id, _, header = traceparent()
        body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        with requests.post(f"{rig.proxy.url}/v1/chat/completions", json=body, headers={"traceparent": header},
                           stream=True, timeout=30) as r:
            text = b"".join(r.iter_content(None)).decode()
        assert "upstream_timeout" in text, text
        spans = rig.request_spans()
    proxy = rig.proxy
    [request] = by_name(spans, f"chat {MODEL}")
    [attempt] = by_name(spans, "upstream attempt")
    for s in (request, attempt):
        assert s["status"] == ERROR and s["attrs"]["error.type"] == "upstream_timeout", s
    assert [e["name"] for e in request["events"]] == ["think_start"], "it stalled while thinking"
    [silent] = [line for line in proxy.json_logs() if line.get("message") == "upstream stream went silent"]
    assert silent["trace_id"] == trace_id and silent["span_id"] == request["span_id"], silent


def test_a_collector_that_hangs_delays_the_exit_at_most_the_flush_limit():
    hung = socket.socket()  # accepts connections, never answers
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)
    upstream = Upstream()
    proxy = Proxy(upstream.url, [
        "telemetry.tracing.enabled=true", "telemetry.tracing.protocol=http/protobuf",
        f"telemetry.tracing.endpoint=http://127.0.0.1:{hung.getsockname()[1]}",
    ])
    try:
        stream_chat(proxy.url, {})
        started = time.time()
        proxy.stop()
        took = time.time() - started
    finally:
        proxy.stop()
        upstream.stop()
        hung.close()
    assert proxy.proc.returncode == 0, "".join(proxy.log)
    assert 2.5 < took < 6, f"exit took {took:.1f} s: the flush waits 3 s at most, the export timeout is 10 s"
    assert any("did not take the last spans" in line for line in proxy.log), proxy.log[-5:]
