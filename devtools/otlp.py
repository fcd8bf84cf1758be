"""An OTLP trace receiver on loopback, over HTTP and gRPC, for the tracing tests and bench.

It decodes what exporters send with OpenTelemetry's own protobuf definitions
(``opentelemetry-proto``) and keeps the spans; nothing is forwarded anywhere.
"""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from devtools.servers import free_port


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root
    links: tuple[str, ...]  # the span ids linked to
    attributes: dict[str, Any]
    events: tuple[str, ...]
    status_code: int  # 0 unset, 1 ok, 2 error


class OtlpReceiver:
    """``http_endpoint`` (OTLP/HTTP, protobuf) and ``grpc_endpoint`` take traces until ``stop``.
    With ``decode=False``, HTTP requests are only counted (for benchmarks: a collector's
    decoding is not the exporter's cost)."""

    def __init__(self, decode: bool = True) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = trace_service_pb2.ExportTraceServiceRequest()
                if decode:
                    request.ParseFromString(body)
                receiver.take(request)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_args: Any) -> None:
                pass

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, _context: Any) -> Any:
                receiver.take(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http_endpoint = f"http://127.0.0.1:{self._http.server_port}/v1/traces"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._grpc)
        port = free_port()
        self._grpc.add_insecure_port(f"127.0.0.1:{port}")
        self._grpc.start()
        self.grpc_endpoint = f"http://127.0.0.1:{port}"

    def take(self, request: Any) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    spans.append(
                        ReceivedSpan(
                            service=str(resource.get("service.name", "")),
                            name=s.name,
                            kind=s.kind,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            links=tuple(link.span_id.hex() for link in s.links),
                            attributes=_attributes(s.attributes),
                            events=tuple(e.name for e in s.events),
                            status_code=s.status.code,
                        )
                    )
        with self._lock:
            self._spans += spans
            self.requests += 1

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._grpc.stop(grace=None)


def _attributes(pairs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in pairs:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out
