"""`tenantnet-ipam` as real processes: concurrency, SIGKILL at random points, host-local parity,
bad configurations through the executable.

These need no root, but run real processes against one store, as a runtime would.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from ipam.sqlite_store import SqliteStore
from tests.unit.test_ipam_config import BAD

IPAM = Path(sys.executable).parent / "tenantnet-ipam"
HOST_LOCAL = Path("/usr/lib/cni/host-local")


@pytest.fixture
def proc_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment for plugin processes: bytecode cached outside the tree, as an
    installed package would have it (otherwise every exec recompiles every module)."""
    assert IPAM.exists(), f"{IPAM} is missing: run .venv/bin/pip install -e '.[test]'"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path_factory.getbasetemp() / "pycache")
    # The node config's ipamDataDirs decide where a config's dataDir may be: this test's tree.
    node = tmp_path_factory.getbasetemp() / "ipam-exec-node.yaml"
    base = tmp_path_factory.getbasetemp()
    # stateDir too: nothing of these tests goes to the host's /var/lib/tenantnet
    node.write_text(f"ipamDataDirs: [{base}]\nresolvConfPaths: [{base}]\nlogFile: {base}/log/tenantnet.log\n"
                    f"stateDir: {base}/state\n")
    env["TENANTNET_CONFIG"] = str(node)
    # compile once, before dozens of processes start at the same instant
    subprocess.run([str(IPAM)], env=dict(env, CNI_COMMAND="VERSION"), capture_output=True,
                   check=True)
    return env


def conf(data_dir: Path, name: str = "pool", **ipam: Any) -> dict[str, Any]:
    ipam.setdefault("ranges", [[{"subnet": "10.40.0.0/24"}]])
    return {"cniVersion": "1.0.0", "name": name, "type": "bridge",
            "ipam": {"type": "tenantnet-ipam", "dataDir": str(data_dir), **ipam}}


def cni_env(base: dict[str, str], command: str, cid: str = "", ifname: str = "eth0") -> dict[str, str]:
    env = dict(base, CNI_COMMAND=command, CNI_PATH=str(IPAM.parent))
    if cid:
        env.update(CNI_CONTAINERID=cid, CNI_IFNAME=ifname, CNI_NETNS=f"/var/run/netns/{cid}")
    return env


def start(plugin: Path | str, env: dict[str, str], config: dict[str, Any],
          *extra: str) -> subprocess.Popen[bytes]:
    with tempfile.TemporaryFile() as stdin:
        stdin.write(json.dumps(config).encode())
        stdin.seek(0)
        return subprocess.Popen([str(plugin), *extra], env=env, stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(p: subprocess.Popen[bytes]) -> tuple[int, Any]:
    out, _ = p.communicate(timeout=60)
    return p.returncode, json.loads(out) if out.strip() else None


def call(plugin: Path, env: dict[str, str], config: dict[str, Any]) -> tuple[int, Any]:
    return finish(start(plugin, env, config))


def test_64_concurrent_adds_get_64_distinct_addresses(tmp_path: Path,
                                                      proc_env: dict[str, str]) -> None:
    # exactly 64 allocatable IPv4 addresses (and a roomy IPv6 set): the pool ends up full
    cfg = conf(tmp_path, ranges=[
        [{"subnet": "10.40.0.0/24", "rangeStart": "10.40.0.100", "rangeEnd": "10.40.0.163"}],
        [{"subnet": "fd00:40::/64"}],
    ])
    procs = {f"ctr{i:02d}": start(IPAM, cni_env(proc_env, "ADD", f"ctr{i:02d}"), cfg)
             for i in range(64)}
    results = {cid: finish(p) for cid, p in procs.items()}
    failed = {cid: out for cid, (rc, out) in results.items() if rc != 0}
    assert not failed
    v4 = [r[1]["ips"][0]["address"] for r in results.values()]
    v6 = [r[1]["ips"][1]["address"] for r in results.values()]
    assert len(set(v4)) == 64 and len(set(v6)) == 64
    assert {a.split("/")[0] for a in v4} == {f"10.40.0.{i}" for i in range(100, 164)}
    store = SqliteStore(str(tmp_path))
    try:
        assert store.verify() == []
        held = {(a.container_id, str(a.address)) for a in store.allocations("pool")}
        assert held == {(cid, r[1]["ips"][k]["address"].split("/")[0])
                        for cid, r in results.items() for k in (0, 1)}
    finally:
        store.close()
    rc, out = call(IPAM, cni_env(proc_env, "ADD", "ctr64"), cfg)
    assert rc == 1 and out["code"] == 110 and "'pool'" in out["msg"]
    assert "10.40.0.100-10.40.0.163" in out["msg"]


# A process that runs the executable's main() but SIGKILLs itself just before its k-th SQL
# statement: kills land exactly between BEGIN, the reads, the INSERT (with its triggers),
# the cursor update and the COMMIT — places a timer rarely hits. k = 0: it dies after the
# commit, just before printing the result (recorded, but the runtime never hears of it).
_KILL_AT_STATEMENT = """
import os, signal, sqlite3, sys
k = int(sys.argv[1]); seen = [0]
class Dying:
    def write(self, _text):
        os.kill(os.getpid(), signal.SIGKILL)
    def flush(self):
        pass
if k == 0:
    sys.stdout = Dying()
real_connect = sqlite3.connect
def connect(*a, **kw):
    db = real_connect(*a, **kw)
    def trace(_sql):
        seen[0] += 1
        if seen[0] == k:
            os.kill(os.getpid(), signal.SIGKILL)
    db.set_trace_callback(trace)
    return db
sqlite3.connect = connect
from tenantnet.entry.ipam import main
sys.exit(main())
"""


def test_sigkill_during_add_never_duplicates_and_gc_leaves_no_leak(
    tmp_path: Path, proc_env: dict[str, str]
) -> None:
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    cfg = conf(tmp_path, ranges=[[{"subnet": "10.41.0.0/22"}], [{"subnet": "fd00:41::/64"}]])
    # how long one ADD takes here, so that timer kills spread over the whole run
    t0 = time.monotonic()
    rc, _ = call(IPAM, cni_env(proc_env, "ADD", "calibrate"), cfg)
    duration = time.monotonic() - t0
    assert rc == 0
    done: dict[str, list[str]] = {"calibrate": []}
    killed = attempts = 0
    while killed < 50 or attempts < 60:
        assert attempts < 200, f"only {killed} kills landed (seed {seed})"
        batch = []
        for _ in range(4):  # a few at once: the others commit while one dies
            cid = f"k{attempts:03d}"
            attempts += 1
            env = cni_env(proc_env, "ADD", cid)
            if attempts % 2:
                p = start(IPAM, env, cfg)
                delay = rnd.uniform(0.2, 1.1) * duration
            else:
                # every fourth one dies after its commit: the orphans GC must reclaim
                k = 0 if attempts % 8 == 0 else rnd.randint(1, 20)
                p = start(sys.executable, env, cfg, "-c", _KILL_AT_STATEMENT, str(k))
                delay = 10.0  # it kills itself
            batch.append((cid, p, time.monotonic() + delay))
        for cid, p, deadline in sorted(batch, key=lambda b: b[2]):
            while p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.001)
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            rc, out = finish(p) if p.returncode is None or p.returncode == 0 else (p.wait(), None)
            if rc == -signal.SIGKILL:
                killed += 1
            elif rc == 0:
                done[cid] = [ip["address"].split("/")[0] for ip in out["ips"]]
            else:
                pytest.fail(f"{cid} exited {rc}: {out} (seed {seed})")
    store = SqliteStore(str(tmp_path))
    try:
        assert store.verify() == [], f"seed {seed}"
        held = store.allocations("pool")
        addresses = [str(a.address) for a in held]
        assert len(addresses) == len(set(addresses)), f"duplicate address (seed {seed})"
        for cid, ips in done.items():
            mine = {str(a.address) for a in held if a.container_id == cid}
            assert not ips or mine == set(ips), f"{cid}: result {ips}, store {mine}"
        orphans = {a.container_id for a in held} - set(done)
        assert orphans, "no kill landed after a commit: the GC half of this test is vacuous"
        # GC with the attachments the runtime knows (those whose ADD succeeded)
        gc_cfg = dict(cfg, **{"cni.dev/valid-attachments": [
            {"containerID": cid, "ifname": "eth0"} for cid in done]})
        assert call(IPAM, cni_env(proc_env, "GC"), gc_cfg) == (0, None)
        after = store.allocations("pool")
        assert {a.container_id for a in after} == set(done), f"leak after GC (seed {seed})"
        assert len(after) == 2 * len(done)
        assert store.verify() == []
    finally:
        store.close()
    # and the store is not wedged: a plain ADD still works
    rc, out = call(IPAM, cni_env(proc_env, "ADD", "after"), cfg)
    assert rc == 0 and len(out["ips"]) == 2


def test_same_addresses_as_host_local_for_the_same_sequence(tmp_path: Path,
                                                            proc_env: dict[str, str]) -> None:
    assert HOST_LOCAL.exists(), "Debian's containernetworking-plugins is not installed"
    ranges = [[{"subnet": "10.42.0.0/28"}, {"subnet": "10.42.1.0/29", "gateway": "10.42.1.6"}],
              [{"subnet": "fd00:42::/125"}]]
    ours = conf(tmp_path / "ours", ranges=ranges)
    theirs = conf(tmp_path / "hl", ranges=ranges)
    theirs["ipam"]["type"] = "host-local"
    rnd = random.Random(7)
    live: list[str] = []
    for step in range(24):
        if live and (rnd.random() < 0.35 or len(live) > 10):
            cid = live.pop(rnd.randrange(len(live)))
            command = "DEL"
        else:
            cid = f"c{step}"
            live.append(cid)
            command = "ADD"
        got = call(IPAM, cni_env(proc_env, command, cid), ours)
        want = call(HOST_LOCAL, cni_env(proc_env, command, cid), theirs)
        if want[1] is not None and want[1].get("dns") == {}:
            del want[1]["dns"]  # host-local prints an empty dns for 1.0.0; libcni omits it
        assert got == want, f"step {step}: {command} {cid}"
    # and the operators' import takes host-local's state over unchanged
    store_dir = tmp_path / "imported"
    cli = subprocess.run(
        [sys.executable, "-m", "tenantnet.ops.ipamctl", "ipam", "import-host-local", str(tmp_path / "hl"),
         "--data-dir", str(store_dir), "--json"],
        env=proc_env, capture_output=True, text=True, check=False)
    assert cli.returncode == 0, cli.stderr
    ours_store, imported = SqliteStore(str(tmp_path / "ours")), SqliteStore(str(store_dir))
    try:
        def key(s: SqliteStore) -> set[tuple[str, str, str]]:
            return {(str(a.address), a.container_id, a.ifname) for a in s.allocations("pool")}
        assert key(imported) == key(ours_store) and len(key(imported)) == 2 * len(live)
        assert imported.cursors() == ours_store.cursors()
    finally:
        ours_store.close()
        imported.close()


def test_bad_configurations_through_the_executable(tmp_path: Path,
                                                   proc_env: dict[str, str]) -> None:
    procs = []
    for i, (case, ipam, code, needles) in enumerate(BAD):
        data_dir = tmp_path / f"store{i}"
        cfg = {"cniVersion": "1.0.0", "name": "pool", "type": "bridge",
               "ipam": {"type": "tenantnet-ipam", "dataDir": str(data_dir), **ipam}}
        procs.append((case, code, needles, data_dir, start(IPAM, cni_env(proc_env, "ADD", "c"),
                                                           cfg)))
    for case, code, needles, data_dir, p in procs:
        rc, out = finish(p)
        assert rc == 1, case
        assert out["code"] == code and out["cniVersion"] == "1.0.0", case
        assert all(n in out["msg"] for n in needles), (case, out["msg"])
        assert not data_dir.exists(), case


def test_version_status_and_garbage_stdin(tmp_path: Path, proc_env: dict[str, str]) -> None:
    rc, out = call(IPAM, cni_env(proc_env, "VERSION"), {"cniVersion": "1.0.0"})
    assert rc == 0 and out["supportedVersions"] == ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
    assert call(IPAM, cni_env(proc_env, "STATUS"), conf(tmp_path)) == (0, None)
    p = subprocess.run([str(IPAM)], env=cni_env(proc_env, "ADD", "c"), input=b"{not json",
                       capture_output=True, check=False)
    assert p.returncode == 1 and json.loads(p.stdout)["code"] == 6
