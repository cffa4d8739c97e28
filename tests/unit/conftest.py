"""Shared unit-test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def allow_tmp_ipam(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the IPAM plugin's dataDir and resolvConf be inside this test's tmp_path, as a node
    config's ipamDataDirs / resolvConfPaths would (the built-in defaults are /var/lib/… and
    /etc/resolv.conf, which unit tests must not touch)."""
    from ipam import config

    monkeypatch.setattr(config, "DEFAULT_CONFINEMENT",
                        config.Confinement((str(tmp_path),), (str(tmp_path),)))
