"""`make demo`'s overlay act (tenantnet/lab/overlaydemo.py) run as CI runs it: its main
function on a private lab root. Every claim it prints must be `[ok  ]` and its own count of
failures 0; the claims that carry the act (isolation, the spoofed MAC, rail 1's underlay)
must be among them; and nothing of the lab may be left afterwards."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tenantnet.lab import overlaydemo, ovn

pytestmark = pytest.mark.root


def test_overlay_act(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(tmp_path / "overlay-demo")
    try:
        failures = overlaydemo.main(root)
    finally:
        ovn.down(root)  # a no-op when the act took its lab down itself, as it must
    out = capsys.readouterr().out
    print(out)
    claims = [line for line in out.splitlines() if line.startswith("  [")]
    assert failures == 0, "\n".join(c for c in claims if "[FAIL]" in c)
    assert claims and all(c.startswith("  [ok  ]") for c in claims), out
    for wanted in ("ICMP a1 (node1) -> a2", "ICMP b1 (tenant-b) -> a1", "ICMP a1 (tenant-a) -> b3",
                   "TCP a1 -> a3", "(tenant-a's server): no connection",
                   "(tenant-b): answered nothing", f"(not a1's): 0 of {overlaydemo.FRAMES} arrived",
                   f"(a1's own), same frames otherwise: {overlaydemo.FRAMES} of {overlaydemo.FRAMES} arrived",
                   "rail 0's legs: 0 packets", "logical switch ports of tenantnet left in the NB: 0"):
        assert any(wanted in c for c in claims), f"no claim {wanted!r} in:\n{out}"
    # every pod bound on its node's rail-1 chassis: the tenants' traffic is rail 1's
    assert "a1@node1-rail1, a2@node2-rail1, a3@node3-rail1, b1@node1-rail1, b3@node3-rail1" in out
    tag = ovn.tag_of(root)
    assert not os.path.exists(root) and ovn._lab_netns(tag) == [] and ovn._lab_links(tag) == []
    assert ovn._strays(root) == []
