"""OpenFlow rules through `ovs-ofctl` (process calls only; what the rules mean is
drivers/prewarm.py).

The switch is addressed by its management socket: OVS keeps `<bridge>.mgmt` in its run
directory, the directory of the node's OVSDB unix socket (as dpctl.py finds the control
socket); a tcp:/ssl: OVSDB may be remote, and then ovs-ofctl's own default (the bridge
name, resolved in its default run directory) is used.

Rule sets are written as one OpenFlow 1.4 bundle (`--bundle`): all of them or none, so a
refused rule (one that overlaps somebody else's at the same priority: `check_overlap`)
leaves nothing half-installed.
"""

from __future__ import annotations

import os
import subprocess

DEFAULT_TIMEOUT = 5.0
_PROTOCOL = "OpenFlow14"  # bundles need 1.4; cookie masks need 1.1+


class OfctlError(Exception):
    def __init__(self, message: str, *, overlap: bool = False) -> None:
        super().__init__(message)
        self.overlap = overlap  # a rule overlapped one at the same priority (check_overlap)


def mgmt_target(ovsdb_endpoint: str, bridge: str) -> str:
    kind, _, rest = ovsdb_endpoint.partition(":")
    if kind == "unix" and rest.startswith("/"):
        candidate = os.path.join(os.path.dirname(rest), f"{bridge}.mgmt")
        if os.path.exists(candidate):
            return f"unix:{candidate}"
    return bridge


def _run(args: list[str], what: str, stdin: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> str:
    cmd = ["ovs-ofctl", "-O", _PROTOCOL, *args]
    try:
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise OfctlError(f"{what}: ovs-ofctl is not installed (Debian: openvswitch-switch)") from None
    except subprocess.TimeoutExpired:
        raise OfctlError(f"{what}: ovs-ofctl did not answer within {timeout:g} s") from None
    if proc.returncode != 0:
        text = (proc.stderr or proc.stdout).strip()
        first = text.splitlines()[0] if text else f"exit status {proc.returncode}"
        raise OfctlError(f"{what}: {first[:400]}", overlap="OFPFMFC_OVERLAP" in text)
    return proc.stdout


def bundle(target: str, lines: list[str], timeout: float = DEFAULT_TIMEOUT) -> None:
    """Apply flow_mod lines (`add …`, `delete_strict …`, `delete …`) atomically, in order."""
    if lines:
        _run(["--bundle", "add-flows", target, "-"], f"writing {len(lines)} OpenFlow rules to {target}",
             "\n".join(lines) + "\n", timeout)


def delete(target: str, match: str, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Delete the rules `match` selects (non-strict: every rule it covers)."""
    _run(["del-flows", target, match], f"deleting OpenFlow rules {match} on {target}", timeout=timeout)


def dump(target: str, match: str, timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """The rules `match` selects, one line each, as ovs-ofctl prints them."""
    out = _run(["--no-stats", "dump-flows", target, match], f"reading OpenFlow rules on {target}",
               timeout=timeout)
    return [line.strip() for line in out.splitlines() if line.strip().startswith("cookie=")]
