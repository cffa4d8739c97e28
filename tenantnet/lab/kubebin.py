"""The Kubernetes lab's binaries: where they come from, checked before use.

Test infrastructure, not part of tenantnet: kube-apiserver, kube-controller-manager,
kube-scheduler and kubelet v1.36.2, containerd (+ containerd-shim-runc-v2, ctr) v2.3.4 and
Multus v4.3.0 (thin), static x86_64 builds. Two sources, in this order:

1. `TENANTNET_KUBE_BIN`: a directory holding those binaries (e.g. unpacked from the upstream
   release tarballs of the same versions, docs/kubernetes.md); taken as it is.
2. `k8s-bin.tar.xz` in the `shared/k8s/` folder beside the checkout (`<repo>/../shared/k8s/`):
   its sha256 is checked against the `SHA256SUMS` beside it, it is unpacked once into
   `<repo>/build/k8s/` (read-only where it lies), every binary checked against the archive's
   own `SHA256SUMS`, and a stamp naming the archive's digest written last — a crash mid-way
   leaves no stamp, so the next run unpacks again.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tenantnet.lab.ovs import LabError

ENV = "TENANTNET_KUBE_BIN"
ARCHIVE = "k8s-bin.tar.xz"
# What the lab runs (multus-daemon/-shim, the thick plugin, are not needed: Multus thin).
BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet",
            "containerd", "containerd-shim-runc-v2", "ctr", "multus")
VERSIONS = {"kubernetes": "v1.36.2", "containerd": "v2.3.4", "multus": "v4.3.0"}
STAMP = ".unpacked"

REPO = Path(__file__).resolve().parents[2]


def shared_dir(repo: Path = REPO) -> Path:
    return repo.parent / "shared" / "k8s"


def build_dir(repo: Path = REPO) -> Path:
    return repo / "build" / "k8s"


HOW_TO_PROVIDE = (
    f"set {ENV} to a directory holding {', '.join(BINARIES)} (Kubernetes {VERSIONS['kubernetes']}, "
    f"containerd {VERSIONS['containerd']}, Multus {VERSIONS['multus']}; docs/kubernetes.md), "
    f"or place {ARCHIVE} and its SHA256SUMS in <checkout>/../shared/k8s/"
)


@dataclass(frozen=True)
class KubeBinaries:
    dir: Path
    source: str  # "TENANTNET_KUBE_BIN" or the archive's path

    def __getitem__(self, name: str) -> str:
        return str(self.dir / name)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _sums(path: Path) -> dict[str, str]:
    sums = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            sums[parts[1].lstrip("*")] = parts[0]
    return sums


def available(repo: Path = REPO) -> str | None:
    """None when the binaries can be had, else why not (one line, with how to provide them)."""
    env = os.environ.get(ENV)
    if env:
        missing = [b for b in BINARIES if not os.access(os.path.join(env, b), os.X_OK)]
        return f"the Kubernetes binaries are not here: {ENV}={env} lacks {', '.join(missing)}; " \
            f"{HOW_TO_PROVIDE}" if missing else None
    if (build_dir(repo) / STAMP).exists() or (shared_dir(repo) / ARCHIVE).exists():
        return None
    return f"the Kubernetes binaries are not here: {HOW_TO_PROVIDE}"


def locate(repo: Path = REPO) -> KubeBinaries:
    """The binaries, unpacking and verifying the archive on first use."""
    why = available(repo)
    if why:
        raise LabError(why)
    env = os.environ.get(ENV)
    if env:
        return KubeBinaries(Path(env), ENV)
    archive, out = shared_dir(repo) / ARCHIVE, build_dir(repo)
    stamp = out / STAMP
    if not archive.exists():  # only the unpacked copy is left: use it as it is
        return KubeBinaries(out / "bin", str(stamp))
    want = _sums(shared_dir(repo) / "SHA256SUMS").get(ARCHIVE)
    if stamp.exists() and want and stamp.read_text().strip() == want:
        return KubeBinaries(out / "bin", str(archive))
    out.parent.mkdir(parents=True, exist_ok=True)
    # One unpacker at a time (two test runs on a fresh checkout): the second finds the stamp.
    with open(out.parent / ".k8s-unpack.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (stamp.exists() and want and stamp.read_text().strip() == want):
            _unpack(archive, out, want)
    return KubeBinaries(out / "bin", str(archive))


def _unpack(archive: Path, out: Path, want: str | None) -> None:
    if want is None:
        raise LabError(f"{archive.parent}/SHA256SUMS has no line for {ARCHIVE}")
    got = _sha256(archive)
    if got != want:
        raise LabError(f"{archive}: sha256 {got}, SHA256SUMS says {want} (a damaged copy)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".k8s-unpack-", dir=out.parent))
    try:
        proc = subprocess.run(["tar", "-xJf", str(archive), "-C", str(tmp)], capture_output=True,
                              text=True, check=False)
        if proc.returncode != 0:
            raise LabError(f"unpacking {archive}: {proc.stderr.strip()}")
        sums = _sums(tmp / "SHA256SUMS")
        for name in BINARIES:
            if name not in sums:
                raise LabError(f"{archive}: its SHA256SUMS does not list {name}")
            if _sha256(tmp / "bin" / name) != sums[name]:
                raise LabError(f"{archive}: bin/{name} does not match its SHA256SUMS")
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    (out / STAMP).write_text(want + "\n")


def versions(bins: KubeBinaries) -> dict[str, str]:
    """What each binary says it is (`--version`), for `lab status`."""
    found = {}
    for name, args in (("kubelet", ["--version"]), ("kube-apiserver", ["--version"]),
                       ("containerd", ["--version"]), ("multus", ["--version"])):
        try:
            proc = subprocess.run([bins[name], *args], capture_output=True, text=True, timeout=30,
                                  check=False)
            found[name] = (proc.stdout or proc.stderr).strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            found[name] = "unknown"
    return found
