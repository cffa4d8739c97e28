"""The whole node state of a lab, as one comparable snapshot — for leftover checks.

`snapshot(lab, netns=[...])` collects everything an attachment (or a crashed attempt at one)
can leave on a lab node, without knowing which names to expect:

- **ovs**: every Port row (name, bridge, external_ids, tag, trunks, vlan_mode) and every
  Interface row (name, type, external_ids) of the lab's OVSDB — one `ovs-vsctl` exec;
- **host_links**: the links of the host namespace (name, alias, MTU, up) that the code under
  test can have made or touched (below);
- **netns**: every link in the given pod namespaces (name, alias, MAC, MTU, up, addresses);
- **vfs**: every VF of every PF of the lab's simulated NIC: its PF-side state as the lab VF
  control reports it (admin MAC, VLAN/QoS/proto, spoofchk, trust, link state, rates) and its
  host netdev (name, MAC, MTU, up, alias; None while it is not in the host namespace);
- **rdma**: where each simulated RDMA device of the NIC is (None: the host);
- **devinfo**: every file under `<lab>/devinfo` with its content;
- **ipam**: every host-local file under the lab's IPAM data directories (allocation files
  with their owner; `last_reserved_ip.*` and `lock` are host-local's cursor and lock, not
  allocations) and every row of tenantnet-ipam's `allocation` and `used_block` tables in
  each `ipam.db` there (the `cursor` table is where allocation goes on, not an allocation);
- **records**: every file under `<stateDir>/attachments` and `<stateDir>/quarantine`, temp
  files (`*.json.tmp.<pid>`) included, with the start of its content;
- **processes**: every live process of a CNI plugin or agent executable (tenantnet, its shim,
  tenantnet-ipam, the agent, any plugin on the lab's CNI_PATH such as host-local) tied to
  this lab — its TENANTNET_CONFIG or command line names the lab or a node config that
  points into it. An exec'd IPAM child whose tenantnet parent was killed is reparented (to
  pid 1 here) and shows up as such a process until it exits.

`diff(before, after)` is "" when they are equal, else one readable line per difference.

Other test runs share this machine (each with its own lab, pods, bridges and veths), so a
host link is kept only when the code under test can have made or touched it:

- a link this lab's simulated NIC is made of (its VF netdevs, embedded-switch peers,
  representors, PF and uplink: veth pairs in the host), or one whose peer or lower link is
  one of those (a VF netdev returned under a wrong name, a VLAN on the PF);
- a link whose peer is in one of the snapshot's `netns` (a pod of ours; a veth dies with its
  namespace, so one whose peer is in another namespace is another run's pod);
- a link without peer or lower link that tenantnet marks as its own: the `tenantnet:`
  ownership mark in its alias, or an attachment's host name (`tn` + 11 hex digits);
- the loopback and hardware devices (lo, eth0: nobody else's test creates those);
- a link the caller names (`names`: say the link names a hostile input asked for).

Everything else — another run's bridge, dummy or veth pair, whatever its name — is not this
lab's doing and is left out, so that it can come and go while a test runs.

A snapshot costs one ovs-vsctl, one `ip` per namespace (two per pod namespace) and a scan
of /proc: ≈ 30-60 ms.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tenantnet.lab.nic import LabNic, LabVfControl

GO_PLUGINS = "/usr/lib/cni"
# Our executables, by name (the shim runs as `python -IS <venv>/bin/tenantnet`); any
# executable in GO_PLUGINS (the lab's CNI_PATH: host-local & co.) counts too.
OWN_EXECUTABLES = {"tenantnet", "tenantnet-ipam", "tenantnetctl"}
_STATE_TEXT = 300  # characters of each record file kept (enough to read phase and key)


def _ip_json(*args: str) -> list[dict[str, Any]]:
    proc = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ip -j {' '.join(args)} failed: {proc.stderr.strip()}")
    return json.loads(proc.stdout) if proc.stdout.strip() else []


def _ns_name(ns: Any) -> str:
    """A Netns (conftest), a /run/netns path, or a bare name."""
    name = getattr(ns, "name", None) or str(ns)
    return os.path.basename(name)


# ---- OVS ------------------------------------------------------------------------------------

def _ovs_value(v: Any) -> Any:
    """OVSDB JSON (["set", [...]], ["map", [...]], ["uuid", x]) to plain, comparable values."""
    if isinstance(v, list) and len(v) == 2 and v[0] in ("set", "map", "uuid"):
        kind, inner = v
        if kind == "set":
            return sorted(_ovs_value(x) for x in inner)
        if kind == "map":
            return {str(_ovs_value(k)): _ovs_value(x) for k, x in inner}
        return inner
    return v


def ovs_rows(lab: Any) -> dict[str, Any]:
    out = lab.vsctl("--format=json",
                    "--columns=_uuid,name,external_ids,tag,trunks,vlan_mode", "list", "Port", "--",
                    "--columns=name,type,external_ids", "list", "Interface", "--",
                    "--columns=name,ports", "list", "Bridge")
    decoder = json.JSONDecoder()
    tables, pos = [], 0
    text = out.strip()
    while pos < len(text):
        doc, end = decoder.raw_decode(text, pos)
        tables.append([dict(zip(doc["headings"], map(_ovs_value, row), strict=True)) for row in doc["data"]])
        pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
    ports, interfaces, bridges = tables
    bridge_of = {uuid: b["name"] for b in bridges for uuid in b["ports"]}
    return {
        "ports": {p["name"]: {"bridge": bridge_of.get(p["_uuid"]), "external_ids": p["external_ids"],
                              "tag": p["tag"], "trunks": p["trunks"], "vlan_mode": p["vlan_mode"]}
                  for p in ports},
        "interfaces": {i["name"]: {"type": i["type"], "external_ids": i["external_ids"]} for i in interfaces},
    }


# ---- links ----------------------------------------------------------------------------------

def _netns_ids() -> dict[int, str]:
    return {int(e["nsid"]): e.get("name", "") for e in _ip_json("netns", "list-id") if "nsid" in e}


def _link(d: Mapping[str, Any]) -> dict[str, Any]:
    return {"alias": d.get("ifalias", ""), "mtu": d.get("mtu"), "up": "UP" in d.get("flags", [])}


def lab_link_names(lab: Any) -> set[str]:
    """The real links the lab's simulated NIC is made of (tenantnet.lab.nic.LabNic's state)."""
    names: set[str] = set()
    for pf_netdev, pf in LabNic(str(lab.root)).read_state().get("pfs", {}).items():
        names.update(filter(None, [pf_netdev, pf.get("uplinkPeer")]))
        for vf in pf.get("vfs", {}).values():
            names.update(filter(None, [vf.get("netdev"), vf.get("peer"), vf.get("representor")]))
    return names


_ATTACHMENT_LINK = re.compile(r"tn[0-9a-f]{11}")
MARK_PREFIX = "tenantnet:"  # tenantnet.plugin.drivers.base.MARK_PREFIX, restated


def _hardware(d: Mapping[str, Any]) -> bool:
    return "LOOPBACK" in d.get("flags", []) or os.path.exists(f"/sys/class/net/{d['ifname']}/device")


def host_links(lab: Any, ours: Iterable[str] = (),
               names: Iterable[str] = ()) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(links kept in the snapshot, every host link's raw `ip -j link` entry by name)."""
    ours, names = set(ours), set(names)
    nsids = None
    lab_links = lab_link_names(lab)
    raw_list = _ip_json("link", "show")
    by_index = {d["ifindex"]: d["ifname"] for d in raw_list}
    kept: dict[str, Any] = {}
    raw: dict[str, dict[str, Any]] = {}
    for d in raw_list:
        name = d["ifname"]
        raw[name] = d
        if name in lab_links or name in names:
            pass  # the lab's own, or named by the caller: always compared
        elif "link_netnsid" in d:
            if nsids is None:
                nsids = _netns_ids()
            if nsids.get(int(d["link_netnsid"])) not in ours:
                continue  # its peer is in a namespace that is not ours: another run's pod
        else:
            # `ip -j` names the peer (or lower link) "link" when it is in this namespace
            other = d.get("link") or by_index.get(d.get("link_index"))
            if other and not {name, other} & lab_links:
                continue  # both ends in the host and neither is our lab's: another lab's NIC
            if not other and not (d.get("ifalias", "").startswith(MARK_PREFIX)
                                  or _ATTACHMENT_LINK.fullmatch(name) or _hardware(d)):
                continue  # unmarked, on its own: another run's bridge, dummy, …
        kept[name] = _link(d)
    return kept, raw


def netns_links(name: str) -> dict[str, Any] | None:
    """Every link in the named namespace with its addresses; None if the namespace is gone."""
    if not os.path.exists(f"/run/netns/{name}"):
        return None
    links = {d["ifname"]: {**_link(d), "mac": d.get("address")} for d in _ip_json("-n", name, "link", "show")}
    for d in _ip_json("-n", name, "addr", "show"):
        if d.get("ifname") in links:
            links[d["ifname"]]["addresses"] = sorted(f"{a['local']}/{a['prefixlen']}"
                                                     for a in d.get("addr_info", []) if "local" in a)
    return links


# ---- the simulated NIC ------------------------------------------------------------------------

def vf_state(lab: Any, raw_links: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    nic = LabNic(str(lab.root))
    ctl = LabVfControl(str(lab.root))
    out: dict[str, Any] = {}
    for pf in nic.describe():
        for vf in pf["vfs"]:
            netdev = None
            d = raw_links.get(vf["netdev"]) if vf["netdev"] else None
            if d is not None:
                netdev = {"name": d["ifname"], "mac": d.get("address"), "mtu": d.get("mtu"),
                          "up": "UP" in d.get("flags", []), "alias": d.get("ifalias", "")}
            out[f"{pf['pf']}/vf{vf['index']} {vf['address']}"] = {
                "pf_side": ctl.read(pf["pf"], vf["index"]).to_dict(), "netdev": netdev}
    return out


# ---- files ----------------------------------------------------------------------------------

def _files(root: Path, keep: int | None = None, skip: tuple[str, ...] = ()) -> dict[str, str]:
    out: dict[str, str] = {}
    if not root.is_dir():
        return out
    for base, _, names in os.walk(root):
        for n in names:
            if n.startswith(skip):
                continue
            path = Path(base) / n
            try:
                st = path.lstat()
                if not stat.S_ISREG(st.st_mode):  # never open a FIFO (it would block) or a device
                    text = f"<{stat.filemode(st.st_mode)}>"
                else:
                    with path.open("rb") as fh:
                        text = fh.read(keep or 1 << 16).decode(errors="replace")
            except OSError as exc:
                text = f"<unreadable: {exc}>"
            out[str(path.relative_to(root))] = text
    return out


def ipam_data_dirs(lab: Any) -> list[Path]:
    root, state = Path(lab.root), Path(lab.state_dir)
    return sorted({Path(lab.hostlocal_dir), root / "ipam", root / "host-local", state / "ipam",
                   state / "host-local"})


def _sqlite_rows(db: Path) -> dict[str, list[Any]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        out = {}
        if "allocation" in tables:
            out["allocation"] = sorted(
                list(r) for r in conn.execute(
                    "SELECT network, address, container_id, ifname, pod_namespace, pod_name, netns "
                    "FROM allocation"))
        if "used_block" in tables:
            out["used_block"] = sorted(
                [r[0], r[1], bytes(r[2]).hex(), *r[3:]] for r in conn.execute(
                    "SELECT network, family, super, sub, w0, w1, w2, w3, used FROM used_block "
                    "WHERE used > 0"))  # an emptied bitmap row is no allocation
        return out
    finally:
        conn.close()


def ipam_rows(lab: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for d in ipam_data_dirs(lab):
        # The store's own files (its database, WAL, reserve) are no allocation: its rows are.
        for rel, text in _files(d, skip=("last_reserved_ip", "lock", "ipam.")).items():
            out[f"{d}/{rel}"] = text.replace("\r\n", " ")
        if d.is_dir():
            for db in sorted(d.rglob("ipam.db")):
                rows = _sqlite_rows(db)
                if any(rows.values()):  # an empty store is as good as none
                    out[str(db)] = rows
    return out


def record_files(lab: Any) -> dict[str, str]:
    state = Path(lab.state_dir)
    out = {}
    for sub in ("attachments", "quarantine"):
        for rel, text in _files(state / sub, keep=_STATE_TEXT).items():
            out[f"{sub}/{rel}"] = text
    return out


# ---- processes ------------------------------------------------------------------------------

# (config path, the lab's paths) → whether the config points into that lab. Keyed by the lab
# too: a process seen first from another lab's snapshot (test_faults.py snapshots three labs
# at once) must not be hidden from its own lab's.
_config_cache: dict[tuple[str, tuple[str, ...]], bool] = {}


def _points_into(path: str, lab_paths: tuple[str, ...]) -> bool:
    if path.startswith(lab_paths):
        return True
    key = (path, lab_paths)
    if key not in _config_cache:
        try:
            with open(path, "rb") as fh:
                text = fh.read(1 << 16).decode(errors="replace")
            _config_cache[key] = any(p in text for p in lab_paths)
        except OSError:
            return False  # not cached: it may appear later
    return _config_cache[key]


def _executable_of(cmdline: list[str]) -> str | None:
    """The plugin or agent a command line runs, or None if it is none of ours."""
    if not cmdline:
        return None
    args = cmdline[:]
    if os.path.basename(args[0]).startswith("python"):
        args = [a for a in args[1:] if not a.startswith("-") or a == "-m"]
        if args[:2] == ["-m", "tenantnet.entry.agentctl"]:
            return "tenantnet-agent"
        if not args:
            return None
    exe = args[0]
    name = os.path.basename(exe)
    if name in OWN_EXECUTABLES or os.path.dirname(exe) == GO_PLUGINS:
        return name
    return None


def processes(lab: Any) -> dict[str, Any]:
    """Live processes of our plugins and agent tied to this lab, keyed by pid and start time."""
    lab_paths = (str(lab.root) + "/", str(lab.state_dir) + "/", str(lab.node_config))
    me = os.getpid()
    out: dict[str, Any] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                cmdline = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
            what = _executable_of(cmdline)
            if what is None:
                continue
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                env = dict(kv.decode(errors="replace").partition("=")[::2]
                           for kv in fh.read().split(b"\0") if b"=" in kv)
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue  # exited meanwhile (or a kernel thread)
        fields = stat[stat.rfind(")") + 2:].split()
        state, ppid, started = fields[0], int(fields[1]), int(fields[19])
        if state == "Z":
            continue  # a zombie holds nothing but its pid
        paths = [env.get("TENANTNET_CONFIG", "")] + [a for a in cmdline if a.startswith("/")]
        if not any(p and _points_into(p, lab_paths) for p in paths):
            continue
        out[f"pid {entry.name} (start {started})"] = {
            "executable": what, "ppid": ppid, "command": env.get("CNI_COMMAND", ""),
            "container_id": env.get("CNI_CONTAINERID", ""), "ifname": env.get("CNI_IFNAME", ""),
            "cmdline": " ".join(cmdline)[:200]}
    return out


def rdma_state(lab: Any) -> dict[str, Any]:
    """Where each simulated RDMA device of the lab's NIC is: None on the host, else the
    holding namespace's identity (the lab's RDMA control, a simulation)."""
    from tenantnet.lab.rdma import LabRdmaControl

    return {d["device"]: d["netns"] for d in LabRdmaControl(str(lab.root)).describe()}


# ---- the snapshot ---------------------------------------------------------------------------

def snapshot(lab: Any, netns: Iterable[Any] = (), links: Iterable[str] = ()) -> dict[str, Any]:
    """The whole node state of `lab` (see the module docstring); `netns`: pod namespaces
    (conftest's Netns, a /run/netns path, or a name) whose links are part of it; `links`:
    host link names compared whatever they are."""
    names = [_ns_name(ns) for ns in netns]
    host, raw = host_links(lab, names, links)
    return {
        "ovs": ovs_rows(lab),
        "host_links": host,
        "netns": {n: netns_links(n) for n in names},
        "vfs": vf_state(lab, raw),
        "rdma": rdma_state(lab),
        "devinfo": _files(Path(lab.root) / "devinfo"),
        "ipam": ipam_rows(lab),
        "records": record_files(lab),
        "processes": processes(lab),
    }


def without_netns(snap: Mapping[str, Any]) -> dict[str, Any]:
    """The snapshot without its pod namespaces (for comparing across a namespace's deletion)."""
    return {**snap, "netns": {}}


def _show(v: Any) -> str:
    text = json.dumps(v, sort_keys=True, default=str)
    return text if len(text) <= 400 else text[:400] + "…"


def _diff(path: str, a: Any, b: Any, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{k}" if path else str(k)
            if k not in b:
                out.append(f"- {sub}: {_show(a[k])}  (gone)")
            elif k not in a:
                out.append(f"+ {sub}: {_show(b[k])}  (new)")
            else:
                _diff(sub, a[k], b[k], out)
    elif a != b:
        out.append(f"~ {path}: {_show(a)} -> {_show(b)}")


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """"" if the snapshots are equal; else one line per difference ('+' new, '-' gone, '~' changed)."""
    out: list[str] = []
    _diff("", dict(before), dict(after), out)
    return "\n".join(out)
