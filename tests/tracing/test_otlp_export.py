"""Spans encoded by hand (``api.otlp_export``) decode to what the SDK's own protobuf encoder makes, and reach a
collector over a kept connection: none lost when it hangs up while idle, none sent twice when it is slow."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import ssl
import time
from pathlib import Path
from typing import Tuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from api.otlp_export import OtlpHttpExporter, encode
from tests.support import free_port
from tests.tracing.collector import Collector


def without_defaults(request: ExportTraceServiceRequest) -> ExportTraceServiceRequest:
    """What the SDK writes and this encoder leaves at its default: an UNSET status, flags, schema URLs."""
    for resource_spans in request.resource_spans:
        resource_spans.ClearField("schema_url")
        for scope_spans in resource_spans.scope_spans:
            scope_spans.ClearField("schema_url")
            for span in scope_spans.spans:
                span.ClearField("flags")
                if span.status.code == 0 and not span.status.message:
                    span.ClearField("status")
    return request


def test_the_encoding_is_the_sdks():
    exported = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "jetway"}), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracer = provider.get_tracer("jetway")
    attributes = {"http.route": "/v1/{collection}/{id}", "count": 5, "negative": -3, "ratio": 0.5, "flag": True}
    attributes["jetway.redis.nodes"] = ["10.0.0.1:6379", "10.0.0.2:6379"]  # an array
    request = tracer.start_span("PUT /v1/{collection}/{id}", kind=SpanKind.SERVER, attributes=attributes)
    call = tracer.start_span("EVALSHA put", trace_api.set_span_in_context(request), SpanKind.CLIENT)
    call.set_status(Status(StatusCode.ERROR, "RedisTimeout"))
    call.end()
    request.set_status(Status(StatusCode.ERROR))
    request.end()
    tracer.start_span("internal, unset status").end()
    spans = exported.get_finished_spans()
    mine = ExportTraceServiceRequest.FromString(encode(spans))
    assert without_defaults(mine) == without_defaults(encode_spans(spans))
    assert len(mine.resource_spans[0].scope_spans[0].spans) == 3


def finished_spans() -> list:
    """Two ended spans of the SDK, as a batch of the span queue hands them to the exporter."""
    exported = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "jetway"}), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracer = provider.get_tracer("jetway")
    tracer.start_span("GET /healthz", kind=SpanKind.SERVER).end()
    tracer.start_span("GET /readyz", kind=SpanKind.SERVER).end()
    return list(exported.get_finished_spans())


def test_batches_share_one_connection():
    with Collector() as receiver:
        exporter = OtlpHttpExporter(receiver.endpoint + "/v1/traces", 5.0)
        assert [exporter.export(finished_spans()) for _ in range(3)] == [SpanExportResult.SUCCESS] * 3
        exporter.shutdown()
    assert (receiver.posts, receiver.connections) == (3, 1)


def test_credentials_in_the_endpoint_are_sent_as_basic_authentication():
    with Collector() as receiver:
        url = (receiver.endpoint + "/v1/traces").replace("http://", "http://jetway:s%40cret@")
        exporter = OtlpHttpExporter(url, 5.0)
        assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
        exporter.shutdown()
    assert receiver.authorizations == ["Basic " + base64.b64encode(b"jetway:s@cret").decode()]


def test_a_connection_the_collector_closed_while_idle_loses_no_batch():
    """The next batch fails on the closed connection at once and goes, once, on a new one."""
    with Collector(hang_up=True) as receiver:
        exporter = OtlpHttpExporter(receiver.endpoint + "/v1/traces", 5.0)
        for _ in range(3):
            assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
            time.sleep(0.05)  # the collector's close has arrived
        exporter.shutdown()
    assert (receiver.posts, receiver.requests, receiver.connections) == (3, 3, 3)


def test_a_refused_batch_a_slow_collector_and_none_at_all_each_fail_once():
    with Collector(status=500) as refusing:
        exporter = OtlpHttpExporter(refusing.endpoint + "/v1/traces", 5.0)
        assert exporter.export(finished_spans()) is SpanExportResult.FAILURE
        exporter.shutdown()
    assert refusing.requests == 1
    with Collector(stall=1.5) as slow:
        exporter = OtlpHttpExporter(slow.endpoint + "/v1/traces", 0.5)
        assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
        started = time.monotonic()
        assert exporter.export(finished_spans()) is SpanExportResult.FAILURE  # on the kept connection
        assert time.monotonic() - started < 1.4  # the timeout, not the collector, ended it
        exporter.shutdown()
    assert slow.requests == 2  # a timeout is the batch's: not sent again
    assert OtlpHttpExporter(f"http://127.0.0.1:{free_port()}/v1/traces", 5.0).export(finished_spans()) is (
        SpanExportResult.FAILURE
    )


def test_an_answer_without_end_is_cut_short():
    """A collector whose answer never ends holds neither the exporter's thread nor its memory."""
    with Collector(endless=True) as receiver:
        exporter = OtlpHttpExporter(receiver.endpoint + "/v1/traces", 5.0)
        started = time.monotonic()
        assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
        assert time.monotonic() - started < 2.0
        assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS  # on a new connection
        exporter.shutdown()
    assert (receiver.posts, receiver.connections) == (2, 2)


def self_signed(directory: Path) -> Tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test collector")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "collector.pem", directory / "collector.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def test_an_https_collector_is_reached_only_with_a_certificate_the_worker_trusts(tmp_path, monkeypatch):
    cert_path, key_path = self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(str(cert_path), str(key_path))
    with Collector(tls=tls) as receiver:
        untrusting = OtlpHttpExporter(receiver.endpoint + "/v1/traces", 5.0)
        assert untrusting.export(finished_spans()) is SpanExportResult.FAILURE
        monkeypatch.setenv("SSL_CERT_FILE", str(cert_path))  # an operator's own authority, as OpenSSL reads it
        trusting = OtlpHttpExporter(receiver.endpoint + "/v1/traces", 5.0)
        assert trusting.export(finished_spans()) is SpanExportResult.SUCCESS
        trusting.shutdown()
    assert receiver.posts == 1
