"""An OTLP/HTTP trace receiver for tests: what a collector is to the exporters, on
127.0.0.1, decoding each `ExportTraceServiceRequest` with `opentelemetry-proto` (no
collector binary can be installed here). Used by tests/emit/test_emit_tracing.py and
tests/e2e/test_tracing.py."""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived: ids in hex (`parent` empty for a root)."""

    trace_id: str
    span_id: str
    parent: str
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    service: str
    events: tuple[tuple[str, int, dict[str, Any]], ...] = ()
    status_code: int = 0  # 0 unset, 1 ok, 2 error
    status_message: str = ""


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


def _attrs(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        assert isinstance(kv, KeyValue)
        out[kv.key] = _value(kv.value)
    return out


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        service = str(_attrs(resource_spans.resource.attributes).get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                spans.append(ReceivedSpan(
                    trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                    parent=s.parent_span_id.hex(), name=s.name,
                    start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                    attributes=_attrs(s.attributes), service=service,
                    events=tuple((e.name, e.time_unix_nano, _attrs(e.attributes))
                                 for e in s.events),
                    status_code=s.status.code, status_message=s.status.message))
    return spans


class OtlpReceiver:
    """A thread serving `POST /v1/traces` on 127.0.0.1 (a free port), keeping every
    span it decodes. `endpoint` is what `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` takes."""

    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.requests = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                spans = decode(body) if self.path == "/v1/traces" else []
                with receiver._lock:
                    receiver._spans.extend(spans)
                    receiver.requests += 1
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="otlp-receiver", daemon=True)
        self._thread.start()

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def wait_for(self, what: str, found: Callable[[list[ReceivedSpan]], bool],
                 timeout: float) -> list[ReceivedSpan]:
        """The spans once `found(spans)` holds; AssertionError naming `what` if it does
        not within `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            if found(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({s.name for s in spans})
                raise AssertionError(f"{what}: not received within {timeout} s; "
                                     f"{len(spans)} span(s) so far: {names}")
            time.sleep(0.1)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)

    def __enter__(self) -> OtlpReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
