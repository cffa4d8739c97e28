"""Where the flow text comes from: the node's `ovs-vswitchd` (ovs-appctl) and OVSDB (ovs-vsctl).

This module owns process calls only (with a time-out and errors that say what to do); the
formats belong to `dpflows.py`. Used by mode ovs-offload (is an attachment's traffic in
hardware?) and by the operators' offload report (tenantnet/ops/flowreport).

Finding the vswitchd control socket (the `-t` target of ovs-appctl):
1. `--appctl-target PATH` (or a daemon name), when given;
2. else, when the node config's `ovsdb` is a unix socket, its directory: OVS keeps the
   OVSDB socket and the daemons' control sockets in one run directory (`$OVS_RUNDIR`,
   /var/run/openvswitch on Debian), so `<dir>/ovs-vswitchd.<pid>.ctl` (pid from
   `<dir>/ovs-vswitchd.pid`, as the distro daemon names it) or `<dir>/ovs-vswitchd.ctl`
   (as the lab names it with `--unixctl`) is the vswitchd that serves that OVSDB;
3. else `ovs-vswitchd`, which ovs-appctl resolves in its default run directory.
A tcp:/ssl: OVSDB may be remote; its vswitchd's control socket is local-only, so for
those we fall back to 3 (and say so in the report).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TARGET = "ovs-vswitchd"
DEFAULT_TIMEOUT = 5.0


class OffloadError(Exception):
    """Reading flows or OVS state failed; the message says why and what to try."""


@dataclass
class Target:
    path: str
    how: str  # how we found it, for the report


def find_target(ovsdb: str, explicit: str | None = None) -> Target:
    if explicit:
        return Target(explicit, "--appctl-target")
    kind, _, rest = ovsdb.partition(":")
    if kind == "unix" and rest.startswith("/"):
        rundir = os.path.dirname(rest)
        try:
            with open(os.path.join(rundir, "ovs-vswitchd.pid")) as fh:
                pid = int(fh.read().strip())
            candidate = os.path.join(rundir, f"ovs-vswitchd.{pid}.ctl")
            if os.path.exists(candidate):
                return Target(candidate, f"pid file in the OVSDB socket's directory {rundir}")
        except (OSError, ValueError):
            pass
        candidate = os.path.join(rundir, "ovs-vswitchd.ctl")
        if os.path.exists(candidate):
            return Target(candidate, f"control socket next to the OVSDB socket in {rundir}")
        return Target(DEFAULT_TARGET, f"no vswitchd control socket in {rundir}; ovs-appctl's default")
    return Target(DEFAULT_TARGET, f"OVSDB {ovsdb} is not a local unix socket; ovs-appctl's default")


def _run(cmd: list[str], timeout: float, what: str) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 1, check=False)
    except FileNotFoundError:
        raise OffloadError(f"{what}: {cmd[0]} is not installed "
                           "(apt-get install openvswitch-switch)") from None
    except subprocess.TimeoutExpired:
        raise OffloadError(f"{what}: no answer within {timeout:g} s") from None
    if proc.returncode != 0:
        # The tools log `...|WARN|...` lines before their own error line: keep the last
        # line that is not such a log record.
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        plain = [ln for ln in lines if "|WARN|" not in ln and "|ERR|" not in ln] or lines
        raise OffloadError(f"{what} failed: {plain[-1] if plain else f'exit code {proc.returncode}'}")
    return proc.stdout


MAX_REPLY = 256 << 20  # a dump of every flow of a loaded node is tens of MB; a bound all the same


def _unixctl(path: str, args: tuple[str, ...], timeout: float) -> str:
    """What `ovs-appctl -t PATH ARGS` prints, asked over the control socket itself: one JSON-RPC
    request (OVS's unixctl protocol, lib/unixctl.c) instead of an exec — ≈ 0.5 ms, not 5."""
    import socket

    what = f"ovs-appctl -t {path} {' '.join(args)}"
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as exc:
            raise OffloadError(f"{what} failed: cannot connect ({exc.strerror or exc}) — is ovs-vswitchd "
                               "running? Give its control socket with --appctl-target PATH") from None
        sock.sendall(json.dumps({"id": 0, "method": args[0], "params": list(args[1:])}).encode())
        buf, decoder = b"", json.JSONDecoder()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OffloadError(f"{what}: no answer within {timeout:g} s")
            sock.settimeout(left)
            try:
                chunk = sock.recv(1 << 20)
            except TimeoutError:
                raise OffloadError(f"{what}: no answer within {timeout:g} s") from None
            if not chunk:
                raise OffloadError(f"{what} failed: ovs-vswitchd closed the connection")
            buf += chunk
            if len(buf) > MAX_REPLY:
                raise OffloadError(f"{what}: answer larger than {MAX_REPLY >> 20} MiB")
            if not chunk.rstrip().endswith(b"}"):
                continue  # a reply ends with its object's brace: decode only then, not per chunk
            try:
                reply, _ = decoder.raw_decode(buf.decode())
            except (ValueError, UnicodeDecodeError):
                continue  # not complete yet
            break
    finally:
        sock.close()
    if not isinstance(reply, dict):
        raise OffloadError(f"{what} failed: not a JSON-RPC reply")
    if reply.get("error") is not None:
        raise OffloadError(f"{what} failed: {str(reply['error']).strip()}")
    return str(reply.get("result") or "")


def appctl(target: str, *args: str, timeout: float = DEFAULT_TIMEOUT) -> str:
    if target.startswith("/") and os.path.exists(target):
        return _unixctl(target, args, timeout)
    try:
        return _run(["ovs-appctl", "-t", target, f"--timeout={max(1, int(timeout))}", *args], timeout,
                    f"ovs-appctl -t {target} {' '.join(args)}")
    except OffloadError as exc:
        if "connect" in str(exc) or "No such file" in str(exc):
            raise OffloadError(f"{exc} — is ovs-vswitchd running? Give its control socket with "
                               "--appctl-target PATH") from None
        raise


@dataclass
class Datapath:
    type: str          # "system", "netdev", "dummy", ...
    name: str          # "system@ovs-system"
    text: str = ""     # the raw -m dump
    ports: dict[str, str] = field(default_factory=dict)  # number -> name


def read_datapaths(target: str, timeout: float = DEFAULT_TIMEOUT,
                   offloaded_only: bool = False) -> list[Datapath]:
    """Every datapath of this vswitchd with its `dump-flows -m` text and port numbers."""
    from tenantnet.plugin.system.dpflows import parse_dpctl_show, parse_dump_dps

    out = []
    for kind, name in parse_dump_dps(appctl(target, "dpctl/dump-dps", timeout=timeout)):
        args = ["dpctl/dump-flows", "-m", name] + (["type=offloaded"] if offloaded_only else [])
        text = appctl(target, *args, timeout=timeout)
        ports = parse_dpctl_show(appctl(target, "dpctl/show", name, timeout=timeout))
        out.append(Datapath(kind, name, text, ports))
    return out


@dataclass
class OvsState:
    other_config: dict[str, str] = field(default_factory=dict)
    ovs_version: str | None = None
    bridges: dict[str, str] = field(default_factory=dict)  # name -> datapath_type ("" = system)
    error: str | None = None


def _ovsdb_map(value: Any) -> dict[str, str]:
    # ovs-vsctl --format=json encodes a map as ["map", [[k, v], ...]]
    if isinstance(value, list) and len(value) == 2 and value[0] == "map":
        return {str(k): str(v) for k, v in value[1]}
    return {}


def _scalar(value: Any) -> str | None:
    if isinstance(value, list):  # ["set", []] is an empty optional column
        return None
    return str(value)


def read_ovs_state(ovsdb: str, timeout: float = DEFAULT_TIMEOUT) -> OvsState:
    """`Open_vSwitch` other_config and bridge datapath types via ovs-vsctl (read-only)."""
    base = ["ovs-vsctl", f"--db={ovsdb}", f"--timeout={max(1, int(timeout))}", "--format=json"]
    state = OvsState()
    try:
        data = json.loads(_run(base + ["--columns=other_config,ovs_version", "list", "Open_vSwitch"],
                               timeout, f"reading OVSDB {ovsdb}"))
        if data.get("data"):
            row = dict(zip(data["headings"], data["data"][0], strict=False))
            state.other_config = _ovsdb_map(row.get("other_config"))
            state.ovs_version = _scalar(row.get("ovs_version"))
        data = json.loads(_run(base + ["--columns=name,datapath_type", "list", "Bridge"], timeout,
                               f"reading OVSDB {ovsdb}"))
        for name, dptype in data.get("data", []):
            state.bridges[str(name)] = _scalar(dptype) or ""
    except (OffloadError, ValueError, TypeError) as exc:
        state.error = str(exc)
    return state
