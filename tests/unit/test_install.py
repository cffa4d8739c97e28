"""The installer (tenantnet/ops/install.py), the runtime builder and the deployment manifests.

Everything happens under tmp_path: the "host" is a directory passed as --host-root. Most
tests use a small fake runtime (a manifest and a few files); the ones that exec a shim
build a real runtime from the system's python3.11 and static busybox (which `make test`
installs; without them they fail), and one runs it with the host's libraries, Python and shell hidden (root only,
in a private mount namespace).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cni import version as cniversion
from tenantnet.ops import install
from tenantnet.ops import runtime as rtmod
from tenantnet.ops.install import InstallError, Options
from tenantnet.plugin import nodeconfig as config
from tenantnet.plugin import nodepath

REPO = Path(__file__).resolve().parents[2]
PACKAGING = REPO / "packaging"


# ------------------------------------------------------------------------------ helpers


# What the installer recognises a trampoline by: an ELF file with the trampoline's mark.
FAKE_TRAMPOLINE = b"\x7fELF fake trampoline " + rtmod.TRAMPOLINE_MARK + b" "


def make_fake_runtime(path: Path, version: str = "0.1.0", payload: str = "v1",
                      trampoline: bool = False) -> rtmod.Runtime:
    """A runtime directory with a valid manifest (not runnable: for file-level tests)."""
    (path / "bin").mkdir(parents=True)
    if trampoline:
        (path / "bin" / "tenantnet-trampoline").write_bytes(FAKE_TRAMPOLINE + payload.encode())
    (path / "lib").mkdir()
    (path / "libexec").mkdir()
    (path / "bin" / "busybox").write_text("fake busybox " + payload)
    os.symlink("busybox", path / "bin" / "sh")
    (path / "bin" / "python3.11").write_text("fake python")
    (path / "lib" / "ld-linux-x86-64.so.2").write_text("fake loader")
    for command in ("tenantnet", "tenantnet-ipam", "tenantnetctl"):
        (path / "libexec" / command).write_text(f"# {command} {payload}\n")
    for f in path.rglob("*"):
        if f.is_file() and not f.is_symlink():
            f.chmod(0o755 if f.parent.name == "bin" else 0o644)
    digest, files = rtmod.tree_digest(path)
    manifest = {
        "format": 1, "name": "tenantnet", "version": version, "digest": digest,
        "python": "bin/python3.11", "loader": "lib/ld-linux-x86-64.so.2", "shell": "bin/sh",
        "entrypoints": {c: f"libexec/{c}" for c in ("tenantnet", "tenantnet-ipam", "tenantnetctl")},
        "files": files,
    }
    if trampoline:
        manifest["trampoline"] = "bin/tenantnet-trampoline"
    (path / rtmod.MANIFEST).write_text(json.dumps(manifest))
    return rtmod.load_runtime(path)


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    for d in ("opt/cni/bin", "opt/tenantnet", "etc/tenantnet"):
        (root / d).mkdir(parents=True)
    # another plugin already there: the installer must never touch it
    (root / "opt/cni/bin/bridge").write_bytes(b"\x7fELF other plugin")
    return root


@pytest.fixture
def runtime(tmp_path: Path) -> rtmod.Runtime:
    return make_fake_runtime(tmp_path / "image" / "runtime")


def opts(host: Path, rt: rtmod.Runtime, **kw: object) -> Options:
    return Options(host_root=host, runtime_src=rt.path, **kw)  # type: ignore[arg-type]


def snapshot(root: Path) -> dict[str, tuple[int, int, bytes | str]]:
    """path -> (mode, inode, content or link) of every file and directory under root."""
    snap: dict[str, tuple[int, int, bytes | str]] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            content: bytes | str = os.readlink(p)
        elif stat.S_ISREG(st.st_mode):
            content = p.read_bytes()
        else:
            content = ""
        snap[str(p.relative_to(root))] = (st.st_mode, st.st_ino, content)
    return snap


def temp_leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(rtmod.TMP_PREFIX)]


# ------------------------------------------------------------------------------ install


def test_install_copies_runtime_and_writes_shims(host: Path, runtime: rtmod.Runtime) -> None:
    lines: list[str] = []
    assert install.install(opts(host, runtime), lines.append) is True

    rt_host = f"/opt/tenantnet/{runtime.name}"
    assert runtime.name == f"0.1.0-{runtime.digest[:12]}"
    copied = rtmod.load_runtime(host / rt_host.lstrip("/"))
    assert rtmod.verify(copied)
    assert (host / rt_host.lstrip("/") / "bin/sh").is_symlink()  # links stay links
    for command in rtmod.PLUGINS:
        shim = host / "opt/cni/bin" / command
        assert stat.S_IMODE(shim.stat().st_mode) == 0o755
        text = shim.read_text()
        # the shim names the host path, never the --host-root it was written through
        assert text.startswith(f"#!{rt_host}/bin/sh\n")
        assert f'"{rt_host}/libexec/{command}"' in text
        assert str(host) not in text
        assert rtmod.shim_runtime(shim) == rt_host
        # without a trampoline in the runtime, the -shim is the same script
        assert (host / "opt/cni/bin" / f"{command}-shim").read_bytes() == shim.read_bytes()
    assert not (host / "opt/cni/bin/tenantnetctl").exists()   # plugins only, unless asked
    assert list((host / "etc/tenantnet").iterdir()) == []      # node config only when asked
    assert temp_leftovers(host) == []
    assert any("installed" in line for line in lines)


def test_install_is_idempotent(host: Path, runtime: rtmod.Runtime) -> None:
    install.install(opts(host, runtime), lambda _: None)
    before = snapshot(host)
    lines: list[str] = []
    assert install.install(opts(host, runtime), lines.append) is False
    assert snapshot(host) == before            # same inodes: nothing rewritten
    assert lines[-1] == "nothing changed: tenantnet is installed"
    assert "/opt/cni/bin/tenantnet: unchanged" in lines


def test_refuses_missing_cni_bin_dir(host: Path, runtime: rtmod.Runtime) -> None:
    shutil.rmtree(host / "opt/cni/bin")
    with pytest.raises(InstallError, match=r"CNI binary directory /opt/cni/bin .*does not exist; refusing"):
        install.install(opts(host, runtime), lambda _: None)
    assert not (host / "opt/cni/bin").exists()
    assert list((host / "opt/tenantnet").iterdir()) == []     # nothing written anywhere


def test_refuses_missing_runtime_dir(host: Path, runtime: rtmod.Runtime) -> None:
    shutil.rmtree(host / "opt/tenantnet")
    with pytest.raises(InstallError, match="runtime directory /opt/tenantnet .*does not exist"):
        install.install(opts(host, runtime), lambda _: None)
    assert sorted(p.name for p in (host / "opt/cni/bin").iterdir()) == ["bridge"]


def test_cli_refusal_is_a_clear_message_and_exit_1(host: Path, runtime: rtmod.Runtime,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code = install.main(["--host-root", str(host), "--runtime-src", str(runtime.path),
                         "--cni-bin-dir", "/var/lib/rancher/k3s/data/current/bin"])
    assert code == 1
    err = capsys.readouterr().err
    assert "CNI binary directory /var/lib/rancher/k3s/data/current/bin" in err
    assert "--cni-bin-dir" in err


def test_refuses_a_runtime_that_does_not_match_its_manifest(host: Path, runtime: rtmod.Runtime) -> None:
    (runtime.path / "libexec" / "tenantnet").write_text("# tampered\n")
    with pytest.raises(InstallError, match="does not match its own manifest"):
        install.install(opts(host, runtime), lambda _: None)
    assert list((host / "opt/tenantnet").iterdir()) == []
    assert sorted(p.name for p in (host / "opt/cni/bin").iterdir()) == ["bridge"]


def test_a_damaged_installed_runtime_is_replaced(host: Path, runtime: rtmod.Runtime) -> None:
    install.install(opts(host, runtime), lambda _: None)
    installed = host / "opt/tenantnet" / runtime.name
    (installed / "libexec" / "tenantnet").write_text("# damaged\n")
    lines: list[str] = []
    assert install.install(opts(host, runtime), lines.append) is True
    assert rtmod.verify(rtmod.load_runtime(installed))
    assert any("does not match its manifest; replacing" in line for line in lines)
    assert temp_leftovers(host) == []


def test_a_failed_copy_leaves_nothing(host: Path, runtime: rtmod.Runtime,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    real_copy2 = shutil.copy2
    calls = {"n": 0}

    def failing_copy2(src: object, dst: object, **kw: object) -> object:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        return real_copy2(src, dst, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(rtmod.shutil, "copy2", failing_copy2)
    with pytest.raises(OSError, match="No space"):
        install.install(opts(host, runtime), lambda _: None)
    assert list((host / "opt/tenantnet").iterdir()) == []      # no partial runtime, no temp dir
    assert sorted(p.name for p in (host / "opt/cni/bin").iterdir()) == ["bridge"]  # no shim


# --------------------------------------------------------------------------- atomicity


def test_atomic_write_renames_a_complete_synced_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "tenantnet"
    target.write_text("old shim\n")
    target.chmod(0o755)
    synced: list[int] = []
    seen: dict[str, object] = {}
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    def replace(src: str, dst: object) -> None:
        # at the moment of the rename: the target is still the whole old file, the temp file
        # (same directory) is the whole new one, executable, and was fsynced
        seen["tmp_dir"] = Path(src).parent
        seen["tmp_content"] = Path(src).read_text()
        seen["tmp_mode"] = stat.S_IMODE(os.stat(src).st_mode)
        seen["target_content"] = target.read_text()
        seen["synced_before"] = len(synced)
        real_replace(src, dst)

    monkeypatch.setattr(rtmod.os, "fsync", fsync)
    monkeypatch.setattr(rtmod.os, "replace", replace)
    assert rtmod.atomic_write(target, b"new shim\n", 0o755) is True
    assert seen == {"tmp_dir": tmp_path, "tmp_content": "new shim\n", "tmp_mode": 0o755,
                    "target_content": "old shim\n", "synced_before": 1}
    assert len(synced) == 2                  # the file, then the directory (the rename)
    assert target.read_text() == "new shim\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tenantnet"]


def test_atomic_write_failure_keeps_the_old_file_and_no_temp(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "tenantnet"
    target.write_text("old shim\n")

    def fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(rtmod.os, "fsync", fsync)
    with pytest.raises(OSError):
        rtmod.atomic_write(target, b"new shim\n", 0o755)
    assert target.read_text() == "old shim\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tenantnet"]


def test_atomic_write_fixes_mode_and_skips_identical(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"same")
    target.chmod(0o644)
    assert rtmod.atomic_write(target, b"same", 0o755) is True    # mode differs: rewritten
    inode = target.stat().st_ino
    assert rtmod.atomic_write(target, b"same", 0o755) is False
    assert target.stat().st_ino == inode


def test_shims_come_after_the_runtime(host: Path, runtime: rtmod.Runtime,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """When a shim appears, the runtime it names is already complete under its final name."""
    real = rtmod.atomic_write
    checked: list[str] = []

    def atomic_write(path: Path, data: bytes, mode: int) -> bool:
        rt = rtmod.shim_runtime_text(data.decode())
        assert rt is not None and rtmod.verify(rtmod.load_runtime(host / rt.lstrip("/")))
        checked.append(path.name)
        return real(path, data, mode)

    monkeypatch.setattr(install, "atomic_write", atomic_write)
    install.install(opts(host, runtime), lambda _: None)
    assert checked == ["tenantnet-shim", "tenantnet", "tenantnet-ipam-shim", "tenantnet-ipam"]


# ------------------------------------------------------------------------- the trampoline


def test_a_runtime_with_a_trampoline_installs_it_in_front_of_the_shims(host: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    rt = make_fake_runtime(tmp_path / "t", trampoline=True)
    real = rtmod.atomic_write
    order: list[str] = []

    def atomic_write(path: Path, data: bytes, mode: int) -> bool:
        if path.name.endswith("-shim"):
            assert rtmod.shim_runtime_text(data.decode()) == f"/opt/tenantnet/{rt.name}"
        else:  # a trampoline only once its -shim is there
            assert data.startswith(FAKE_TRAMPOLINE) and (path.parent / f"{path.name}-shim").is_file()
        order.append(path.name)
        return real(path, data, mode)

    monkeypatch.setattr(install, "atomic_write", atomic_write)
    lines: list[str] = []
    assert install.install(opts(host, rt), lines.append) is True
    assert order == ["tenantnet-shim", "tenantnet", "tenantnet-ipam-shim", "tenantnet-ipam"]
    bin_dir = host / "opt/cni/bin"
    for command in rtmod.PLUGINS:
        assert (bin_dir / command).read_bytes() == (rt.path / "bin/tenantnet-trampoline").read_bytes()
        assert stat.S_IMODE((bin_dir / command).stat().st_mode) == 0o755
        assert rtmod.installed_runtime(bin_dir, command) == f"/opt/tenantnet/{rt.name}"
    assert any("/opt/cni/bin/tenantnet: written (the compiled trampoline)" in line for line in lines)
    lines.clear()
    assert install.status(opts(host, rt), lines.append) is True
    assert lines[0] == f"/opt/cni/bin/tenantnet: ok (compiled trampoline), tenantnet 0.1.0 from /opt/tenantnet/{rt.name}"
    assert install.install(opts(host, rt), lambda _: None) is False  # idempotent


def test_status_of_a_trampoline_without_its_shim_or_of_another_build(host: Path, tmp_path: Path) -> None:
    rt = make_fake_runtime(tmp_path / "t", trampoline=True)
    install.install(opts(host, rt), lambda _: None)
    bin_dir = host / "opt/cni/bin"
    (bin_dir / "tenantnet-ipam").write_bytes(FAKE_TRAMPOLINE + b"another build")
    (bin_dir / "tenantnet-shim").unlink()
    lines: list[str] = []
    assert install.status(opts(host, rt), lines.append) is False
    assert lines == ["/opt/cni/bin/tenantnet: the trampoline, but /opt/cni/bin/tenantnet-shim is missing or "
                     "not written by this installer",
                     f"/opt/cni/bin/tenantnet-ipam: a trampoline that is not its runtime /opt/tenantnet/{rt.name}'s"]
    install.install(opts(host, rt), lambda _: None)  # repairs both
    assert install.status(opts(host, rt), lambda _: None) is True


def test_upgrade_from_shims_to_a_trampoline_and_back(host: Path, tmp_path: Path) -> None:
    plain = make_fake_runtime(tmp_path / "p", "0.1.0", "plain")
    compiled = make_fake_runtime(tmp_path / "c", "0.2.0", "compiled", trampoline=True)
    bin_dir = host / "opt/cni/bin"
    install.install(opts(host, plain), lambda _: None)
    lines: list[str] = []
    install.install(opts(host, compiled), lines.append)
    assert rtmod.is_trampoline(bin_dir / "tenantnet") and "(replaced a file not written" not in "".join(lines)
    install.install(opts(host, plain), lines.append)
    assert rtmod.shim_runtime(bin_dir / "tenantnet") == f"/opt/tenantnet/{plain.name}"
    # the trampoline's runtime was the one in use before: kept, as for shims
    assert sorted(p.name for p in (host / "opt/tenantnet").iterdir()) == sorted([plain.name, compiled.name])


def test_uninstall_removes_the_trampoline_and_its_shims(host: Path, tmp_path: Path) -> None:
    rt = make_fake_runtime(tmp_path / "t", trampoline=True)
    before = snapshot(host)
    install.install(opts(host, rt), lambda _: None)
    lines: list[str] = []
    assert install.uninstall(opts(host, rt), lines.append) is True
    assert snapshot(host) == before
    assert lines[:2] == ["/opt/cni/bin/tenantnet: removed", "/opt/cni/bin/tenantnet-shim: removed"]
    # a foreign ELF (another plugin of that name) is never taken for ours
    (host / "opt/cni/bin/tenantnet").write_bytes(b"\x7fELF someone else's tenantnet")
    install.uninstall(opts(host, rt), lines.append)
    assert (host / "opt/cni/bin/tenantnet").exists()
    assert "/opt/cni/bin/tenantnet: left in place (not written by this installer)" in lines


# ------------------------------------------------------------------- upgrade, uninstall


def test_upgrade_switches_shims_keeps_previous_prunes_older(host: Path, tmp_path: Path) -> None:
    v1 = make_fake_runtime(tmp_path / "v1", "0.1.0", "one")
    v2 = make_fake_runtime(tmp_path / "v2", "0.2.0", "two")
    v3 = make_fake_runtime(tmp_path / "v3", "0.3.0", "three")
    rtdir = host / "opt/tenantnet"
    install.install(opts(host, v1), lambda _: None)
    install.install(opts(host, v2), lambda _: None)
    assert rtmod.shim_runtime(host / "opt/cni/bin/tenantnet") == f"/opt/tenantnet/{v2.name}"
    # v1 stays: a plugin exec'd just before the switch may still be importing from it
    assert sorted(p.name for p in rtdir.iterdir()) == sorted([v1.name, v2.name])
    lines: list[str] = []
    install.install(opts(host, v3), lines.append)
    assert sorted(p.name for p in rtdir.iterdir()) == sorted([v2.name, v3.name])
    assert f"runtime /opt/tenantnet/{v1.name}: removed (superseded)" in lines


def test_same_version_rebuilt_gets_its_own_directory(host: Path, tmp_path: Path) -> None:
    a = make_fake_runtime(tmp_path / "a", "0.1.0", "build-a")
    b = make_fake_runtime(tmp_path / "b", "0.1.0", "build-b")
    install.install(opts(host, a), lambda _: None)
    installed_a = snapshot(host / "opt/tenantnet" / a.name)
    install.install(opts(host, b), lambda _: None)
    assert a.name != b.name
    # the directory the old shims named was never modified under a running plugin
    assert snapshot(host / "opt/tenantnet" / a.name) == installed_a


def test_uninstall_removes_exactly_what_was_installed(host: Path, runtime: rtmod.Runtime,
                                                      tmp_path: Path) -> None:
    (host / "opt/tenantnet/README.site").write_text("the operator's own file")
    cm = tmp_path / "cm.yaml"
    cm.write_text("logLevel: debug\n")
    before = snapshot(host)
    install.install(opts(host, runtime, node_config=cm), lambda _: None)
    # a crash of an earlier run left a temp file: ours by name, so removed too
    (host / "opt/cni/bin" / f"{rtmod.TMP_PREFIX}tenantnet-x").write_text("partial")
    lines: list[str] = []
    assert install.uninstall(opts(host, runtime, remove_node_config=True), lines.append) is True
    assert snapshot(host) == before
    assert "/opt/cni/bin/tenantnet: removed" in lines
    assert install.uninstall(opts(host, runtime), lines.append) is False
    assert lines[-1] == "nothing to remove: tenantnet is not installed"


def test_uninstall_keeps_node_config_unless_asked_and_foreign_files(host: Path,
                                                                    runtime: rtmod.Runtime,
                                                                    tmp_path: Path) -> None:
    cm = tmp_path / "cm.yaml"
    cm.write_text("logLevel: info\n")
    install.install(opts(host, runtime, node_config=cm), lambda _: None)
    (host / "opt/cni/bin/tenantnet-ipam").write_text("#!/bin/sh\n# someone else's\n")
    lines: list[str] = []
    install.uninstall(opts(host, runtime), lines.append)
    assert (host / "etc/tenantnet/tenantnet.yaml").read_text() == "logLevel: info\n"
    assert (host / "opt/cni/bin/tenantnet-ipam").exists()
    assert "/opt/cni/bin/tenantnet-ipam: left in place (not written by this installer)" in lines
    assert not (host / "opt/cni/bin/tenantnet").exists()


# --------------------------------------------------------------------------- node config


def test_node_config_written_only_when_asked_and_validated(host: Path, runtime: rtmod.Runtime,
                                                           tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("ovsdb: unix:/run/openvswitch/db.sock\nlogLevel: debug\n")
    lines: list[str] = []
    install.install(opts(host, runtime, node_config=good), lines.append)
    dest = host / "etc/tenantnet/tenantnet.yaml"
    assert dest.read_text() == good.read_text()
    assert stat.S_IMODE(dest.stat().st_mode) == 0o644
    assert f"/etc/tenantnet/tenantnet.yaml: written from {good}" in lines

    bad = tmp_path / "bad.yaml"
    bad.write_text("logLevel: loud\n")
    with pytest.raises(InstallError, match="refusing to install the node config: .*logLevel"):
        install.install(opts(host, runtime, node_config=bad), lambda _: None)
    assert dest.read_text() == good.read_text()     # the good one stays


def test_status(host: Path, runtime: rtmod.Runtime) -> None:
    lines: list[str] = []
    assert install.status(opts(host, runtime), lines.append) is False
    install.install(opts(host, runtime), lambda _: None)
    lines.clear()
    assert install.status(opts(host, runtime), lines.append) is True
    assert lines[0] == f"/opt/cni/bin/tenantnet: ok, tenantnet 0.1.0 from /opt/tenantnet/{runtime.name}"
    (host / "opt/tenantnet" / runtime.name / "lib/ld-linux-x86-64.so.2").unlink()
    assert install.status(opts(host, runtime), lines.append) is False
    assert "lacks lib/ld-linux-x86-64.so.2" in lines[-1]


def test_unsafe_runtime_paths_refused(runtime: rtmod.Runtime) -> None:
    with pytest.raises(InstallError, match="absolute path"):
        rtmod.shim_text(runtime, "/opt/my tenantnet/x", "tenantnet")
    with pytest.raises(InstallError, match="too long"):
        rtmod.shim_text(runtime, "/" + "a" * 130, "tenantnet")


def test_register_adds_install_to_a_subparsers_object(host: Path, runtime: rtmod.Runtime,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="tenantnetctl")
    parser.add_argument("--node-config")      # tenantnetctl's own global option
    sub = parser.add_subparsers(dest="command")
    install.register(sub)
    args = parser.parse_args(["--node-config", "/etc/x.yaml", "install", "--host-root", str(host),
                              "--runtime-src", str(runtime.path)])
    assert args.node_config == "/etc/x.yaml" and args.install_node_config is None
    assert args.func(args) == 0
    assert "/opt/cni/bin/tenantnet: written" in capsys.readouterr().out
    args = parser.parse_args(["install", "--host-root", str(host), "--status"])
    assert args.func(args) == 0
    args = parser.parse_args(["install", "--remove-node-config"])
    assert args.func(args) == 2


def test_wait_stays_resident_until_sigterm(host: Path, runtime: rtmod.Runtime) -> None:
    """The DaemonSet's main container: check, then sleep until SIGTERM, then exit 0 at once."""
    install.install(opts(host, runtime), lambda _: None)
    proc = subprocess.Popen([sys.executable, "-m", "tenantnet.ops.install", "--host-root", str(host),
                             "--status", "--wait"], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout is not None
        assert "ok, tenantnet 0.1.0" in proc.stdout.readline()   # blocks until it has checked
        assert proc.poll() is None
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()


# ------------------------------------------------------------- a real runtime, exec'd

build_runtime_spec = importlib.util.spec_from_file_location("build_runtime", PACKAGING / "build_runtime.py")
assert build_runtime_spec and build_runtime_spec.loader
build_runtime = importlib.util.module_from_spec(build_runtime_spec)
sys.modules["build_runtime"] = build_runtime
build_runtime_spec.loader.exec_module(build_runtime)

SYSTEM_PYTHON = shutil.which("python3.11", path="/usr/bin:/bin")
BUSYBOX = shutil.which("busybox", path="/usr/bin:/bin")


def _can_build() -> str | None:
    if not SYSTEM_PYTHON or not BUSYBOX:
        return "needs /usr/bin/python3.11 and busybox-static"
    if build_runtime.elf_interpreter(Path(BUSYBOX)) is not None:
        return "busybox is not the static one (apt-get install busybox-static)"
    if not Path("/sbin/ldconfig").exists():
        return "needs /sbin/ldconfig"
    return None


@pytest.fixture(scope="module")
def real_runtime(tmp_path_factory: pytest.TempPathFactory) -> rtmod.Runtime:
    reason = _can_build()
    if reason:
        # `make test` installs busybox-static and python3.11: missing means a broken setup.
        pytest.fail(f"cannot build a real runtime here: {reason}")
    work = tmp_path_factory.mktemp("build")
    site = work / "site"
    site.mkdir()
    for pkg in ("cni", "hostfiles", "ipam", "tenantnet"):
        shutil.copytree(REPO / pkg, site / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    out = work / "runtime"
    # no byte-compiling (speed); the self-check limited to what this partial site/ can import
    build_runtime.build(out, site, Path(SYSTEM_PYTHON), Path(BUSYBOX), version="0.1.0",
                        compile_bytecode=False,
                        self_check_imports=("ssl", "sqlite3", "ctypes", "cni.skel", "tenantnet.entry.ipam",
                                            "tenantnet.entry.plugin", "tenantnet.ops.install"))
    return rtmod.load_runtime(out)


def _run_version(exe: Path) -> subprocess.CompletedProcess[str]:
    # as kubelet would: a bare environment, nothing on stdin
    return subprocess.run([str(exe)], env={"CNI_COMMAND": "VERSION"}, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)


def test_built_runtime_is_complete(real_runtime: rtmod.Runtime) -> None:
    m = real_runtime.manifest
    # the build system has a C compiler and a static libc (make test installs them): the
    # runtime carries the static trampoline, and the installer recognises it
    assert m.get("trampoline") == "bin/tenantnet-trampoline", "no trampoline built: gcc/libc6-dev missing?"
    trampoline = real_runtime.path / m["trampoline"]
    assert build_runtime.elf_interpreter(trampoline) is None and rtmod.is_trampoline(trampoline)
    assert rtmod.verify(real_runtime)
    lib = real_runtime.path / "lib"
    for name in ("libc.so.6", "libgcc_s.so.1", Path(m["loader"]).name):
        assert (lib / name).is_file(), name
    assert (real_runtime.path / "bin/sh").resolve() == (real_runtime.path / "bin/busybox")
    assert set(m["entrypoints"]) >= {"tenantnet", "tenantnet-ipam", "tenantnetctl", "tenantnet-install"}
    assert m["glibc"] and m["arch"]


def test_installed_shims_exec_the_copied_runtime(real_runtime: rtmod.Runtime, host: Path,
                                                 tmp_path: Path) -> None:
    # the host's paths are the real ones here (no --host-root): the shim names tmp_path dirs
    bin_dir, rt_dir = tmp_path / "cni-bin", tmp_path / "opt-tenantnet"
    bin_dir.mkdir()
    rt_dir.mkdir()
    o = Options(runtime_src=real_runtime.path, cni_bin_dir=str(bin_dir), runtime_dir=str(rt_dir))
    install.install(o, lambda _: None)
    # the runtime it was copied from goes away: the copy must stand alone
    moved = real_runtime.path.with_name("runtime-moved-away")
    real_runtime.path.rename(moved)
    try:
        for command in rtmod.PLUGINS:
            assert rtmod.is_trampoline(bin_dir / command)
            for exe in (bin_dir / command, bin_dir / f"{command}-shim"):  # no agent: via the -shim
                proc = _run_version(exe)
                assert proc.returncode == 0, proc.stderr
                assert json.loads(proc.stdout) == cniversion.version_info()
                assert proc.stderr == ""
    finally:
        moved.rename(real_runtime.path)
    # running it wrote nothing into the runtime (-B): its digest still holds
    assert rtmod.verify(rtmod.load_runtime(rt_dir / real_runtime.name))


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_shim_runs_with_the_hosts_python_libc_and_shell_hidden(real_runtime: rtmod.Runtime,
                                                               tmp_path: Path) -> None:
    """A host with no Python, no glibc, no shell, no ld.so.cache: the shim still answers."""
    bin_dir, rt_dir, empty = tmp_path / "bin", tmp_path / "rt", tmp_path / "empty"
    for d in (bin_dir, rt_dir, empty):
        d.mkdir()
    install.install(Options(runtime_src=real_runtime.path, cni_bin_dir=str(bin_dir),
                            runtime_dir=str(rt_dir)), lambda _: None)
    bb = str(rt_dir / real_runtime.name / "bin/busybox")   # static: runs with everything hidden
    loader = build_runtime.elf_interpreter(Path(SYSTEM_PYTHON))
    libc = build_runtime.needed_libraries(loader, Path(SYSTEM_PYTHON))["libc.so.6"]
    hide = [str(Path(libc).resolve().parent), str(Path(loader).resolve().parent),
            "/usr/lib/python3.11", "/usr/bin", "/bin"]
    hide = [p for p in dict.fromkeys(hide) if Path(p).is_dir() and not Path(p).is_symlink()]
    script = "".join(f"{bb} mount --bind {empty} {p} && " for p in hide)
    script += f"{bb} mount --bind /dev/null /etc/ld.so.cache && "
    script += f"test ! -e /usr/bin/python3.11 && exec {bin_dir / 'tenantnet'}"
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", bb, "sh", "-c", script],
                          env={"CNI_COMMAND": "VERSION"}, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == cniversion.version_info()


# ------------------------------------------------------------------------- manifests


def _daemonset() -> dict:
    return yaml.safe_load((PACKAGING / "daemonset.yaml").read_text())


def test_daemonset_mounts_what_the_node_needs() -> None:
    ds = _daemonset()
    assert ds["kind"] == "DaemonSet"
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    host_paths = {v["hostPath"]["path"]: v for v in spec["volumes"] if "hostPath" in v}
    required = {"/opt/cni/bin", "/opt/tenantnet", "/etc/tenantnet", "/var/lib/tenantnet",
                "/var/log/tenantnet", "/var/run/netns", "/run/openvswitch", "/sys",
                "/var/run/k8s.cni.cncf.io/devinfo"}
    assert required <= set(host_paths)
    # a missing CNI bin dir must stop the pod, not be created
    assert host_paths["/opt/cni/bin"]["hostPath"]["type"] == "Directory"
    by_name = {v["name"]: v for v in spec["volumes"]}
    for c in spec["initContainers"] + spec["containers"]:
        assert c["securityContext"]["privileged"] is True
        for m in c["volumeMounts"]:
            assert m["name"] in by_name
    main = spec["containers"][0]
    mounted = {by_name[m["name"]]["hostPath"]["path"]: m for m in main["volumeMounts"]
               if "hostPath" in by_name[m["name"]]}
    assert required <= set(mounted)
    assert mounted["/var/run/netns"]["mountPropagation"] == "HostToContainer"


def test_daemonset_install_args_match_the_installer_and_configmap() -> None:
    spec = _daemonset()["spec"]["template"]["spec"]
    init = spec["initContainers"][0]
    p = argparse.ArgumentParser()
    install.add_arguments(p)
    args = p.parse_args(init["args"])
    assert args.host_root == Path("/host") and not args.uninstall
    # every host directory the installer writes is mounted under --host-root
    mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    for host_path in (args.cni_bin_dir, args.runtime_dir, str(Path(args.node_config_dest).parent)):
        name = mounts[f"/host{host_path}"]
        assert vols[name]["hostPath"]["path"] == host_path
    # the node config comes from the ConfigMap in configmap.yaml
    cm_mount = next(m for m in init["volumeMounts"] if str(args.install_node_config).startswith(m["mountPath"]))
    cm = yaml.safe_load((PACKAGING / "configmap.yaml").read_text())
    assert vols[cm_mount["name"]]["configMap"]["name"] == cm["metadata"]["name"]
    assert args.install_node_config.name in cm["data"]
    main_args = p.parse_args(spec["containers"][0]["args"])
    assert main_args.status and main_args.wait


def test_configmap_is_a_valid_node_config(tmp_path: Path) -> None:
    cm = yaml.safe_load((PACKAGING / "configmap.yaml").read_text())
    path = tmp_path / "tenantnet.yaml"
    path.write_text(cm["data"]["tenantnet.yaml"])
    node = config.load(str(path))
    assert node.ovsdb == "unix:/run/openvswitch/db.sock"
    assert node.vf_control == "netlink" and node.sysfs_root == "/sys"
    assert set(yaml.safe_load(path.read_text())) == {"ovsdb", "stateDir", "logFile", "logLevel",
                                                     "ovsdbTimeout", "ovsWait", "sysfsRoot", "vfControl",
                                                     "agentSocket", "metricsPort", "metricsAddress",
                                                     "metricsOffloadInterval", "vswitchdLog",
                                                     "metricsTokenFile"}
    assert node.metrics_port == 9477


def test_the_packaged_metrics_endpoint_asks_for_the_token_of_a_secret_the_agent_mounts() -> None:
    """Served on the node's every address, so with a token (its series name every tenant's
    pods): the node config's metricsTokenFile lies in the agent's read-only mount of the
    optional Secret tenantnet-metrics-token."""
    cm = yaml.safe_load((PACKAGING / "configmap.yaml").read_text())
    node = yaml.safe_load(cm["data"]["tenantnet.yaml"])
    assert node["metricsAddress"] == "0.0.0.0" and node["metricsTokenFile"]
    spec = _daemonset()["spec"]["template"]["spec"]
    agent = next(c for c in spec["containers"] if c["name"] == "agent")
    mount = next(m for m in agent["volumeMounts"]
                 if Path(node["metricsTokenFile"]).parent == Path(m["mountPath"]))
    assert mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "tenantnet-metrics-token"
    assert volume["secret"]["optional"] is True  # CNI calls do not wait for it; /metrics answers 503


def test_daemonset_exposes_the_metrics_port_of_the_node_config(tmp_path: Path) -> None:
    spec = _daemonset()["spec"]["template"]
    agent = next(c for c in spec["spec"]["containers"] if c["name"] == "agent")
    cm = yaml.safe_load((PACKAGING / "configmap.yaml").read_text())
    port = yaml.safe_load(cm["data"]["tenantnet.yaml"])["metricsPort"]
    assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in agent["ports"]
    assert spec["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    log_dir = str(Path(yaml.safe_load(cm["data"]["tenantnet.yaml"])["vswitchdLog"]).parent)
    assert mounts[log_dir]["readOnly"] is True  # the agent reads vswitchd's log, never writes it


def test_daemonset_runs_the_agent_where_the_shims_look_for_it(tmp_path: Path) -> None:

    spec = _daemonset()["spec"]["template"]["spec"]
    agent = next(c for c in spec["containers"] if c["name"] == "agent")
    assert agent["command"][-2:] == ["agent", "run"] and agent["command"][0].endswith("tenantnetctl")
    assert spec.get("hostPID") is True  # CNI_NETNS may be /proc/<pid>/ns/net
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert {"name": "TENANTNET_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in agent["env"]
    vols = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    assert Path(env["TENANTNET_CONFIG"]).parent.as_posix() in mounts  # the node config the init wrote
    cm = yaml.safe_load((PACKAGING / "configmap.yaml").read_text())
    path = tmp_path / "tenantnet.yaml"
    path.write_text(cm["data"]["tenantnet.yaml"])
    sock, declared = nodepath.agent_socket_of(str(path))
    assert declared and config.load(str(path)).agent_socket == sock
    # The socket's directory is one level below a host directory mounted at the same path:
    # the shims on the host find the socket, and the agent creates that directory 0700 itself
    # (kubelet creates hostPath directories 0755, which the agent rightly refuses).
    run_dir = Path(sock).parent.parent.as_posix()
    assert vols[mounts[run_dir]["name"]]["hostPath"]["path"] == run_dir
    for needed in ("/var/run/netns", "/run/openvswitch", "/var/lib/tenantnet", "/sys", "/opt/cni/bin"):
        assert vols[mounts[needed]["name"]]["hostPath"]["path"] == needed
    assert mounts["/var/run/netns"]["mountPropagation"] == "HostToContainer"
    probe = agent["livenessProbe"]["exec"]["command"]
    assert probe[1:3] == ["agent", "status"]


def test_containerfile_builds_the_runtime_and_launchers() -> None:
    text = (PACKAGING / "Containerfile").read_text()
    assert "debian:12" in text
    assert "busybox-static" in text and "openvswitch-switch" in text and "iproute2" in text
    assert "packaging/build_runtime.py" in text and "--launchers /usr/local/bin" in text
    # the trampoline's source goes into the build stage (which has gcc), its -shims into the image
    assert "COPY trampoline/ trampoline/" in text and "gcc libc6-dev" in text
    assert "/usr/local/bin/tenantnet-shim" in text and "/usr/local/bin/tenantnet-ipam-shim" in text
    assert 'ENTRYPOINT ["/usr/local/bin/tenantnet-install"]' in text
