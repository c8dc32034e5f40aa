"""Tracing's settings (``api.config``), and that tracing off loads nothing of the SDK (``api.tracing_start``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from api.config import ConfigError, from_environment
from api.tracing_start import tracing_starter
from tests.support import ROOT


def test_off_by_default_with_every_new_trace_sampled_once_on():
    settings = from_environment({})
    assert settings.tracing_endpoint == "" and settings.tracing_sample == 1.0
    assert settings.tracing_service == "jetway"
    assert tracing_starter(settings, object(), object()) is None


def test_the_settings_are_read():
    settings = from_environment(
        {
            "JETWAY_TRACING_ENDPOINT": "http://otel-collector:4318",
            "JETWAY_TRACING_SAMPLE": "0.01",
            "JETWAY_TRACING_SERVICE": "jetway-eu",
        }
    )
    assert (settings.tracing_endpoint, settings.tracing_sample, settings.tracing_service) == (
        "http://otel-collector:4318",
        0.01,
        "jetway-eu",
    )


@pytest.mark.parametrize(
    "name, value",
    [
        ("JETWAY_TRACING_ENDPOINT", "otel-collector:4318"),
        ("JETWAY_TRACING_ENDPOINT", "http://a b"),
        ("JETWAY_TRACING_SAMPLE", "1.5"),
        ("JETWAY_TRACING_SAMPLE", "-0.1"),
        ("JETWAY_TRACING_SAMPLE", "nan"),
        ("JETWAY_TRACING_SERVICE", "x" * 129),
    ],
)
def test_a_bad_value_names_its_variable(name, value):
    with pytest.raises(ConfigError, match=name):
        from_environment({name: value})


def test_off_the_sdk_is_never_imported():
    """A worker's modules, its application made: no module of opentelemetry (nor protobuf) in the process."""
    script = (
        "import sys, api.worker, api.app, api.master\n"
        "from api.config import from_environment\n"
        "from api.tracing_start import tracing_starter\n"
        "assert tracing_starter(from_environment({}), None, None) is None\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('opentelemetry', 'google')))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout
