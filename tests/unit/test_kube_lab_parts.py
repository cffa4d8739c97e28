"""The Kubernetes lab's pure parts (no root): where the binaries come from and how they are
checked (tenantnet/lab/kubebin.py), the images it builds (tenantnet/lab/kubeimages.py), the
names and addresses each lab takes on the host (tenantnet/lab/kubeconf.py).
The lab itself runs in tests/e2e/test_kube_lab.py."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from tenantnet.lab import kubebin, kubeimages
from tenantnet.lab.ovs import LabError


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fake_archive(base: Path, tamper: str | None = None) -> Path:
    """<base>/repo (a checkout) and <base>/shared/k8s/ with an archive of fake binaries."""
    repo, shared = base / "repo", base / "shared" / "k8s"
    repo.mkdir(parents=True)
    shared.mkdir(parents=True)
    files = {name: f"#!/bin/sh\necho {name}\n".encode() for name in kubebin.BINARIES}
    sums = "".join(f"{_sha(data)}  {name}\n" for name, data in files.items())
    if tamper:
        files[tamper] += b"# changed after the sums were made\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, data in [*((f"bin/{n}", d) for n, d in files.items()), ("SHA256SUMS", sums.encode())]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    archive = buf.getvalue()
    (shared / kubebin.ARCHIVE).write_bytes(archive)
    (shared / "SHA256SUMS").write_text(f"{_sha(archive)}  {kubebin.ARCHIVE}\n")
    return repo


def test_neither_source_says_how_to_provide_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kubebin.ENV, raising=False)
    why = kubebin.available(tmp_path / "repo")
    assert why is not None and why.startswith("the Kubernetes binaries are not here: ")
    assert kubebin.ENV in why and kubebin.ARCHIVE in why and "\n" not in why
    with pytest.raises(LabError, match="not here"):
        kubebin.locate(tmp_path / "repo")


def test_env_dir_must_hold_every_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in kubebin.BINARIES[:-1]:
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv(kubebin.ENV, str(tmp_path))
    why = kubebin.available(tmp_path)
    assert why is not None and why.startswith(
        f"the Kubernetes binaries are not here: {kubebin.ENV}={tmp_path} lacks {kubebin.BINARIES[-1]}; set ")
    (tmp_path / kubebin.BINARIES[-1]).write_text("#!/bin/sh\n")
    (tmp_path / kubebin.BINARIES[-1]).chmod(0o755)
    bins = kubebin.locate(tmp_path / "elsewhere")
    assert bins.dir == tmp_path and bins["kubelet"] == str(tmp_path / "kubelet")


def test_archive_is_checked_and_unpacked_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kubebin.ENV, raising=False)
    repo = _fake_archive(tmp_path)
    bins = kubebin.locate(repo)
    assert bins.dir == repo / "build" / "k8s" / "bin"
    assert sorted(p.name for p in bins.dir.iterdir()) == sorted(kubebin.BINARIES)
    assert (repo / "build" / "k8s" / kubebin.STAMP).read_text().strip() == \
        _sha((tmp_path / "shared" / "k8s" / kubebin.ARCHIVE).read_bytes())

    def no_second_unpack(*_: object) -> None:
        raise AssertionError("unpacked again")
    monkeypatch.setattr(kubebin, "_unpack", no_second_unpack)
    assert kubebin.locate(repo) == bins


def test_damaged_archive_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kubebin.ENV, raising=False)
    repo = _fake_archive(tmp_path)
    with open(tmp_path / "shared" / "k8s" / kubebin.ARCHIVE, "ab") as fh:
        fh.write(b"x")
    with pytest.raises(LabError, match="a damaged copy"):
        kubebin.locate(repo)
    assert not (repo / "build" / "k8s" / kubebin.STAMP).exists()


def test_binary_not_matching_the_archives_sums_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kubebin.ENV, raising=False)
    repo = _fake_archive(tmp_path, tamper="kubelet")
    with pytest.raises(LabError, match="bin/kubelet does not match its SHA256SUMS"):
        kubebin.locate(repo)
    assert not (repo / "build" / "k8s").exists()
    # no half-unpacked directory left (the unpackers' lock file stays)
    assert [p.name for p in (repo / "build").iterdir()] == [".k8s-unpack.lock"]


def test_images_share_one_busybox_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "busybox"
    fake.write_bytes(b"\x7fELF not really busybox")
    monkeypatch.setattr(kubeimages, "BUSYBOX", str(fake))
    names = kubeimages.build_archive(tmp_path / "images.tar")
    assert names == [kubeimages.PAUSE_IMAGE, kubeimages.BUSYBOX_IMAGE]
    with tarfile.open(tmp_path / "images.tar") as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        layer = tar.extractfile("layer.tar").read()  # type: ignore[union-attr]
        configs = [json.load(tar.extractfile(m["Config"])) for m in manifest]  # type: ignore[arg-type]
    assert [m["RepoTags"] for m in manifest] == [[n] for n in names]
    for m, config in zip(manifest, configs, strict=True):
        assert m["Layers"] == ["layer.tar"]
        assert config["rootfs"]["diff_ids"] == ["sha256:" + _sha(layer)]
    assert configs[0]["config"]["Cmd"][0] == "/bin/sleep" and configs[1]["config"]["Cmd"] == ["/bin/sh"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as rootfs:
        assert rootfs.extractfile("bin/busybox").read() == fake.read_bytes()  # type: ignore[union-attr]
        links = {m.name: m.linkname for m in rootfs.getmembers() if m.issym()}
    assert {links[f"bin/{a}"] for a in ("sh", "sleep", "ping", "ip")} == {"busybox"}


def test_each_lab_names_its_own_host_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    """Labs side by side: links (at most 15 characters), cgroup and addresses differ by dir;
    a slot whose node address or pod subnet this machine already uses is passed over."""
    from tenantnet.lab import kube, kubeconf

    a, b = kubeconf.NodeNet(kubeconf.tag("/run/lab-a"), 0), kubeconf.NodeNet(kubeconf.tag("/run/lab-b"), 0)
    assert len({a.link, a.peer, a.bridge, b.link, b.peer, b.bridge}) == 6
    assert all(len(n) <= 15 for n in (a.link, a.peer, a.bridge)) and a.cgroup != b.cgroup
    first = (int(kubeconf.tag("/run/lab-a"), 16)) % kubeconf.SLOTS
    taken = kubeconf.NodeNet("x", first)
    second = kubeconf.NodeNet("x", (first + 1) % kubeconf.SLOTS)
    outputs = {"ip addr": f"5: tk0n    inet {taken.node_ip}/30 scope global tk0n\n",
               "ip route": f"{second.pod_subnet} dev tk1b proto kernel scope link\n"}
    monkeypatch.setattr(kube, "_run", lambda cmd, what, **_: outputs[what])
    chosen = kube._choose_net("/run/lab-a")
    assert chosen.slot == (first + 2) % kubeconf.SLOTS, "the slots whose addresses are in use are passed over"
    assert chosen.node_ip.startswith("172.30.255.") and chosen.pod_subnet.endswith(".0/24")
