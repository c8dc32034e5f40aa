"""release/build.sh and the release name /healthz reports (handlers.health.release).

Building a release fetches wheels, so the whole build runs in
``make test-deploy`` (tests/deploy/test_deploy_boot.py checks its contents and
installs it); here, what needs no network: the builder's refusals, and the
name a release's code reports.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from handlers import health
from tests.support import ROOT

BUILD = ROOT / "release" / "build.sh"


@pytest.mark.parametrize("label", ["../x", "-b", "a b", "x" * 65, ".hidden"])
def test_the_builder_refuses_a_label_that_is_not_a_plain_directory_name(label, tmp_path):
    result = subprocess.run(
        [str(BUILD), "--version", label, "--out", str(tmp_path)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2 and "bad version label" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_builder_refuses_a_commit_that_does_not_exist(tmp_path):
    result = subprocess.run(
        [str(BUILD), "--commit", "no-such-rev", "--out", str(tmp_path)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode != 0 and list(tmp_path.iterdir()) == []


@pytest.fixture
def release_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(health, "RELEASE_FILE", tmp_path / "RELEASE")
    health.release.cache_clear()
    yield tmp_path / "RELEASE"
    health.release.cache_clear()


def test_code_from_a_release_names_it_once_per_process(release_file):
    release_file.write_text("1a2b3c-b\n")
    assert health.release() == "1a2b3c-b"
    release_file.write_text("other\n")  # a later `current` does not change a running process
    assert health.release() == "1a2b3c-b"


def test_code_from_a_checkout_names_no_release(release_file):
    assert health.release() == ""
