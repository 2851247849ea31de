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

import json
import os
import queue
import secrets
import ssl
import subprocess
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
import requests
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from conftest import binary, wait_ready

MODEL = "Qwen/Qwen3-8B"
REASONING = ["Let", " me", " think", " about", " it"]
ANSWER = ["Hello", " world"]


# ---------- an OTLP receiver, both transports ----------


class Spans:
    """Every span received, flattened to dicts, plus the resources they came with."""

    def __init__(self):
        self.items = []
        self.resources = []
        self.cond = threading.Condition()

    def add(self, req: trace_service_pb2.ExportTraceServiceRequest):
        with self.cond:
            for rs in req.resource_spans:
                self.resources.append({a.key: value(a.value) for a in rs.resource.attributes})
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.items.append(span_dict(s))
            self.cond.notify_all()

    def wait_for(self, pred, timeout=20.0):
        deadline = time.time() + timeout
        with self.cond:
            while not pred(self.items):
                left = deadline - time.time()
                if left <= 0:
                    raise AssertionError(f"spans never arrived; have {[s['name'] for s in self.items]}")
                self.cond.wait(left)
            return list(self.items)


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def span_dict(s):
    return {
        "name": s.name,
        "trace_id": s.trace_id.hex(),
        "span_id": s.span_id.hex(),
        "parent": s.parent_span_id.hex(),
        "kind": s.kind,
        "start": s.start_time_unix_nano,
        "end": s.end_time_unix_nano,
        "attrs": {a.key: value(a.value) for a in s.attributes},
        "events": [
            {"name": e.name, "time": e.time_unix_nano, "attrs": {a.key: value(a.value) for a in e.attributes}}
            for e in s.events
        ],
        "status": s.status.code,
    }


class HttpReceiver:
    def __init__(self, tls=None):
        self.spans = Spans()
        spans = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                req = trace_service_pb2.ExportTraceServiceRequest()
                req.ParseFromString(body)
                spans.add(req)
                out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *_):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(tls.chain, tls.key)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            self.endpoint = f"https://localhost:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


class GrpcReceiver:
    def __init__(self, tls=None):
        self.spans = Spans()
        spans = self.spans

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                spans.add(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.server)
        if tls:
            creds = grpc.ssl_server_credentials([(tls.key.read_bytes(), tls.chain.read_bytes())])
            port = self.server.add_secure_port("127.0.0.1:0", creds)
            self.endpoint = f"https://localhost:{port}"
        else:
            port = self.server.add_insecure_port("127.0.0.1:0")
            self.endpoint = f"http://127.0.0.1:{port}"
        self.server.start()

    def stop(self):
        self.server.stop(0)


class Certs:
    """A private CA and a `localhost` certificate it signed (the proxy trusts the CA
    through SSL_CERT_FILE, which the system-roots loader reads)."""

    def __init__(self, d):
        def run(*args):
            subprocess.run(["openssl", *args], check=True, capture_output=True)

        self.ca, ca_key = d / "ca.pem", d / "ca.key"
        self.key, csr, leaf, self.chain = d / "leaf.key", d / "leaf.csr", d / "leaf.pem", d / "chain.pem"
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", self.ca, "-days", "1",
            "-subj", "/CN=meridian test CA")
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", self.key, "-out", csr, "-subj", "/CN=localhost")
        ext = d / "leaf.ext"
        ext.write_text("subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
        run("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", ca_key, "-CAcreateserial", "-out", leaf,
            "-days", "1", "-extfile", ext)
        self.chain.write_bytes(leaf.read_bytes() + self.ca.read_bytes())


# ---------- an upstream that records what it is sent ----------


def chunk(delta, finish=None):
    return {"id": "chatcmpl-t", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


class Upstream:
    """vLLM's streaming dialect: reasoning in `delta.reasoning`, then the answer in
    `delta.content`, then usage and `[DONE]`. A continuation (an assistant message to
    continue) is answered with the answer alone. `gap_s` paces the chunks."""

    def __init__(self, gap_s=0.02, think_chunks=REASONING, head_delay_s=0.0, stall_after=None):
        self.requests = []
        self.head_delay_s = head_delay_s
        # After this many events the stream goes silent for good (an engine that hangs).
        self.stall_after = stall_after
        up = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = b"{}"
                if self.path == "/v1/models":
                    body = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                up.requests.append({"headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
                continued = body.get("continue_final_message") is True
                time.sleep(up.head_delay_s)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                events = [chunk({"role": "assistant", "content": ""})]
                if not continued:
                    events += [chunk({"reasoning": t}) for t in think_chunks]
                events += [chunk({"content": t}) for t in ANSWER]
                events += [chunk({}, "stop"),
                           {"id": "chatcmpl-t", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
                            "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 7, "total_tokens": 14}}]
                try:
                    for i, e in enumerate(events):
                        if i == up.stall_after:
                            time.sleep(5)
                            return
                        self.wfile.write(f"data: {json.dumps(e)}\n\n".encode())
                        self.wfile.flush()
                        time.sleep(up.gap_s)
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the proxy cut this leg

            def log_message(self, *_):
                pass

        self.gap_s = gap_s
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


# ---------- the proxy, its logs read as they come ----------


class Hook:
    """The policy channel of Meridian's engine hook, as far as the proxy sees it: a hello
    that says it can end thinking, and directives recorded."""

    def __init__(self):
        self.directives = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def reply(self, obj):
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self.reply({"protocol": 1, "min_protocol": 1, "hook_version": "test", "policy": "fcfs",
                            "entropy": False, "can_end_thinking": True})

            def do_POST(self):
                batch = json.loads(self.rfile.read(int(self.headers["content-length"])))
                hook.directives += batch["directives"]
                self.reply({"accepted": len(batch["directives"]), "seq": len(hook.directives)})

            def log_message(self, *_):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


class Proxy:
    def __init__(self, upstream_url, settings=(), env=None):
        args = [binary("meridian"), "serve", "--listen", "127.0.0.1:0",
                "--set", "upstream.health_interval_s=0.5", "--set", "telemetry.log_format=json"]
        if upstream_url:
            args += ["--upstream", upstream_url]
        for s in settings:
            args += ["--set", s]
        self.proc = subprocess.Popen([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, "MERIDIAN_LOG_LEVEL": "info", **(env or {})})
        self.lines = queue.Queue()
        self.log = []
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.time() + 30
        self.url = None
        while self.url is None:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.time()))
            except queue.Empty:
                line = None
            if line is None or time.time() > deadline:
                self.stop()
                raise RuntimeError("meridian did not start:\n" + "".join(self.log))
            if "listening on http://" in line and not line.startswith("{"):
                self.url = line.split("listening on ")[1].strip()
        wait_ready(self.url)

    def _read(self):
        for line in self.proc.stdout:
            self.log.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def json_logs(self):
        out = []
        for line in self.log:
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def traceparent():
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, parent, f"00-{trace_id}-{parent}-01"


def stream_chat(url, headers, extra=None):
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}], **(extra or {})}
    with requests.post(f"{url}/v1/chat/completions", json=body, headers=headers, stream=True, timeout=30) as r:
        assert r.status_code == 200, r.text
        text = b"".join(r.iter_content(None)).decode()
    assert "[DONE]" in text and "Hello" in text, text
    return text


def by_name(spans, name):
    found = [s for s in spans if s["name"] == name]
    assert found, f"no span {name!r} among {[s['name'] for s in spans]}"
    return found


def parent_of(header):
    version, trace_id, span_id, flags = header.split("-")
    assert version == "00" and flags == "01", header
    return trace_id, span_id


SERVER, CLIENT = trace_pb2.Span.SPAN_KIND_SERVER, trace_pb2.Span.SPAN_KIND_CLIENT
ERROR = trace_pb2.Status.STATUS_CODE_ERROR


# ---------- the tests ----------


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_request_span_tree_events_and_propagation(protocol):
    receiver = HttpReceiver() if protocol == "http/protobuf" else GrpcReceiver()
    upstream = Upstream()
    proxy = Proxy(upstream.url, [
        "telemetry.tracing.enabled=true",
        f"telemetry.tracing.protocol={protocol}",
        f"telemetry.tracing.endpoint={receiver.endpoint}",
        # Admission on, with room: the wait is a span even when it is short.
        "admission.enabled=true", "admission.max_streams=8",
    ], env={"OTEL_BSP_SCHEDULE_DELAY": "100"})
    try:
        trace_id, client_span, header = traceparent()
        stream_chat(proxy.url, {"traceparent": header, "x-request-id": "trace-me"},
                    {"stream_options": {"include_usage": True}})
        spans = receiver.spans.wait_for(lambda s: any(x["name"].startswith("chat ") for x in s))
    finally:
        proxy.stop()
        upstream.stop()
        receiver.stop()

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
    upstream = Upstream()
    proxy = Proxy(upstream.url, [
        "telemetry.tracing.enabled=true", f"telemetry.tracing.protocol={protocol}",
        f"telemetry.tracing.endpoint={receiver.endpoint}",
    ], env={"OTEL_BSP_SCHEDULE_DELAY": "100", "SSL_CERT_FILE": str(certs.ca)})
    try:
        trace_id, _, header = traceparent()
        stream_chat(proxy.url, {"traceparent": header})
        spans = receiver.spans.wait_for(lambda s: any(x["name"].startswith("chat ") for x in s))
    finally:
        proxy.stop()
        upstream.stop()
        receiver.stop()
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


def test_continuation_leg_is_a_span_and_carries_its_own_traceparent():
    receiver = HttpReceiver()
    # Thinking outlasts the 0.3 s time budget; no hook, so the proxy continues the stream.
    upstream = Upstream(gap_s=0.1, think_chunks=[f" step{i}" for i in range(40)])
    proxy = Proxy(upstream.url, [
        "telemetry.tracing.enabled=true", "telemetry.tracing.protocol=http/protobuf",
        f"telemetry.tracing.endpoint={receiver.endpoint}", "budget.think_seconds=0.3",
    ], env={"OTEL_BSP_SCHEDULE_DELAY": "100"})
    try:
        trace_id, _, header = traceparent()
        stream_chat(proxy.url, {"traceparent": header})
        spans = receiver.spans.wait_for(lambda s: any(x["name"].startswith("chat ") for x in s))
    finally:
        proxy.stop()
        upstream.stop()
        receiver.stop()
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
    receiver = HttpReceiver()
    hook = Hook()
    # Thinking outlasts the 0.2 s time budget: the proxy tells the hook to end it, and
    # to forget the request once it is over.
    upstream = Upstream(gap_s=0.05, think_chunks=[f" step{i}" for i in range(12)])
    proxy = Proxy(None, [
        f'upstream.endpoints=[{{url = "{upstream.url}", hook = "{hook.addr}"}}]',
        "telemetry.tracing.enabled=true", "telemetry.tracing.protocol=http/protobuf",
        f"telemetry.tracing.endpoint={receiver.endpoint}", "budget.think_seconds=0.2",
    ], env={"OTEL_BSP_SCHEDULE_DELAY": "100", "MERIDIAN_HOOK_TOKEN": "s3cret"})
    try:
        trace_id, _, header = traceparent()
        stream_chat(proxy.url, {"traceparent": header})
        spans = receiver.spans.wait_for(lambda s: sum(x["name"].startswith("hook ") for x in s) >= 2)
    finally:
        proxy.stop()
        upstream.stop()
        hook.stop()
        receiver.stop()
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
    receiver = HttpReceiver()
    upstream = Upstream()
    proxy = Proxy(upstream.url, [
        "telemetry.tracing.enabled=true", "telemetry.tracing.protocol=http/protobuf",
        f"telemetry.tracing.endpoint={receiver.endpoint}",
    ], env={"OTEL_BSP_SCHEDULE_DELAY": "100"})
    try:
        trace_id, _, header = traceparent()
        stream_chat(proxy.url, {"traceparent": header})
        spans = receiver.spans.wait_for(lambda s: any(x["name"].startswith("chat ") for x in s))
    finally:
        proxy.stop()
        upstream.stop()
        receiver.stop()
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
    receiver = HttpReceiver()
    upstream = Upstream()
    proxy = Proxy(upstream.url, [
        "telemetry.tracing.enabled=true", "telemetry.tracing.protocol=http/protobuf",
        f"telemetry.tracing.endpoint={receiver.endpoint}",
    ], env={"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SDK_DISABLED": "true"})
    try:
        _, _, header = traceparent()
        stream_chat(proxy.url, {"traceparent": header})
    finally:
        proxy.stop()
        upstream.stop()
        receiver.stop()
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
    receiver = HttpReceiver()
    upstream = Upstream()
    proxy = Proxy(upstream.url, [
        "telemetry.tracing.enabled=true", "telemetry.tracing.protocol=http/protobuf",
        f"telemetry.tracing.endpoint={receiver.endpoint}", "telemetry.tracing.sample_ratio=0",
    ], env={"OTEL_BSP_SCHEDULE_DELAY": "100"})
    try:
        stream_chat(proxy.url, {})  # a new trace: dropped at ratio 0
        trace_id, _, header = traceparent()
        stream_chat(proxy.url, {"traceparent": header})  # the client sampled it: kept
        spans = receiver.spans.wait_for(lambda s: any(x["name"].startswith("chat ") for x in s))
        time.sleep(0.5)
    finally:
        proxy.stop()
        upstream.stop()
        receiver.stop()
    assert {s["trace_id"] for s in receiver.spans.items} == {trace_id}, spans
    unsampled, sampled = (r["headers"]["traceparent"] for r in upstream.requests)
    assert unsampled.endswith("-00"), "the drop decision travels upstream too"
    assert sampled.split("-")[1] == trace_id and sampled.endswith("-01")


def test_a_client_that_leaves_before_the_response_ends_the_span_so_marked():
    receiver = HttpReceiver()
    upstream = Upstream(head_delay_s=1.0)
    proxy = Proxy(upstream.url, [
        "telemetry.tracing.enabled=true", "telemetry.tracing.protocol=http/protobuf",
        f"telemetry.tracing.endpoint={receiver.endpoint}",
    ], env={"OTEL_BSP_SCHEDULE_DELAY": "100"})
    try:
        trace_id, _, header = traceparent()
        body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        with pytest.raises(requests.exceptions.ReadTimeout):
            requests.post(f"{proxy.url}/v1/chat/completions", json=body, headers={"traceparent": header}, timeout=0.3)
        spans = receiver.spans.wait_for(lambda s: any(x["name"].startswith("chat ") for x in s))
    finally:
        proxy.stop()
        upstream.stop()
        receiver.stop()
    [request] = by_name(spans, f"chat {MODEL}")
    assert request["trace_id"] == trace_id
    assert request["attrs"]["meridian.outcome"] == "client_disconnected"
    assert request["status"] != ERROR, "a client that left is not the proxy's failure"


def test_an_upstream_that_goes_silent_fails_the_spans_and_its_warning_joins_the_trace():
    receiver = HttpReceiver()
    upstream = Upstream(stall_after=3)
    proxy = Proxy(upstream.url, [
        "telemetry.tracing.enabled=true", "telemetry.tracing.protocol=http/protobuf",
        f"telemetry.tracing.endpoint={receiver.endpoint}", "upstream.idle_timeout_s=0.5",
    ], env={"OTEL_BSP_SCHEDULE_DELAY": "100"})
    try:
        trace_id, _, header = traceparent()
        body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        with requests.post(f"{proxy.url}/v1/chat/completions", json=body, headers={"traceparent": header},
                           stream=True, timeout=30) as r:
            text = b"".join(r.iter_content(None)).decode()
        assert "upstream_timeout" in text, text
        spans = receiver.spans.wait_for(lambda s: any(x["name"].startswith("chat ") for x in s))
    finally:
        proxy.stop()
        upstream.stop()
        receiver.stop()
    [request] = by_name(spans, f"chat {MODEL}")
    [attempt] = by_name(spans, "upstream attempt")
    for s in (request, attempt):
        assert s["status"] == ERROR and s["attrs"]["error.type"] == "upstream_timeout", s
    assert [e["name"] for e in request["events"]] == ["think_start"], "it stalled while thinking"
    [silent] = [line for line in proxy.json_logs() if line.get("message") == "upstream stream went silent"]
    assert silent["trace_id"] == trace_id and silent["span_id"] == request["span_id"], silent


def test_a_collector_that_hangs_delays_the_exit_at_most_the_flush_limit():
    import socket

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
