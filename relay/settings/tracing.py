"""Tracing's settings: OpenTelemetry's standard variables, not ``RELAY_*``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from relay.errors import ConfigError
from relay.settings.parse import flag


@dataclass(frozen=True)
class TracingSettings:
    """Whether the relay traces, and how its spans leave: read from OpenTelemetry's standard
    variables (in the environment, never the relay's env file, so that every OpenTelemetry
    component in a pod reads the same). Everything else (endpoint, headers, sampler, service
    name, resource) the OpenTelemetry SDK reads from ``OTEL_*`` itself.

    Unlike the SDK's default (``otlp``), tracing is off unless ``OTEL_TRACES_EXPORTER`` asks
    for an exporter: a relay installed without a collector must not try to reach one.
    """

    exporter: str = "none"  # none, otlp, console
    protocol: str = "http/protobuf"  # for otlp: http/protobuf or grpc

    @property
    def enabled(self) -> bool:
        return self.exporter != "none"

    @classmethod
    def load(cls, environ: Mapping[str, str]) -> TracingSettings:
        disabled = environ.get("OTEL_SDK_DISABLED", "").strip()
        try:
            if disabled and flag(disabled):
                return cls()
        except ValueError as exc:
            raise ConfigError(f"OTEL_SDK_DISABLED={disabled!r}: {exc}") from None
        exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "none"
        if exporter not in _TRACE_EXPORTERS:
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER={exporter!r}: must be one of {', '.join(_TRACE_EXPORTERS)}"
            )
        for var in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
            if protocol := environ.get(var, "").strip().lower():
                if protocol not in _OTLP_PROTOCOLS:
                    raise ConfigError(
                        f"{var}={protocol!r}: must be one of {', '.join(_OTLP_PROTOCOLS)}"
                    )
                return cls(exporter, protocol)
        return cls(exporter)


_TRACE_EXPORTERS = ("none", "otlp", "console")
# OpenTelemetry's Python exporters do not implement http/json.
_OTLP_PROTOCOLS = ("http/protobuf", "grpc")
