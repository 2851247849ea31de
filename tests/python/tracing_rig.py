"""The rig of the trace tests: OTLP receivers (HTTP/protobuf decoded with the official
`opentelemetry-proto` messages, gRPC through grpcio, either over TLS with a private CA),
an upstream speaking vLLM's streaming dialect that records the headers it gets, a fake
policy channel of the engine hook, and the real `meridian` binary with its JSON logs."""


import contextlib
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


class Traced:
    """A proxy exporting its traces to a receiver, in front of an upstream that records
    what it gets (and a hook, when the test has one)."""

    def __init__(self, receiver, upstream, proxy, hook=None):
        self.receiver, self.upstream, self.proxy, self.hook = receiver, upstream, proxy, hook

    def request_spans(self):
        """The spans exported once the request span is among them."""
        return self.receiver.spans.wait_for(lambda s: any(x["name"].startswith("chat ") for x in s))


@contextlib.contextmanager
def traced(*settings, protocol="http/protobuf", receiver=None, upstream=None, hook=None, env=None):
    """Starts a `Traced` rig: tracing on to `receiver` (a new one for `protocol` by
    default) with a short batch delay, plus `settings`; everything it started is stopped
    however the test ends, the proxy first so its last spans leave while the receiver
    listens."""
    with contextlib.ExitStack() as stack:
        receiver = receiver or (HttpReceiver() if protocol == "http/protobuf" else GrpcReceiver())
        stack.callback(receiver.stop)
        upstream = upstream or Upstream()
        stack.callback(upstream.stop)
        if hook is not None:
            stack.callback(hook.stop)
        route = [f'upstream.endpoints=[{{url = "{upstream.url}", hook = "{hook.addr}"}}]'] if hook else []
        proxy = Proxy(None if hook else upstream.url, [
            "telemetry.tracing.enabled=true", f"telemetry.tracing.protocol={protocol}",
            f"telemetry.tracing.endpoint={receiver.endpoint}", *route, *settings,
        ], env={"OTEL_BSP_SCHEDULE_DELAY": "100", **(env or {})})
        stack.callback(proxy.stop)
        yield Traced(receiver, upstream, proxy, hook)


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


