"""A private etcd for tests: own data directory, free loopback ports, stopped by its pid."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from tests.polling import poll


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EtcdServer:
    """One etcd member on 127.0.0.1 (Debian's etcd-server 3.4), started and stopped here."""

    def __init__(self, root: Path, name: str = "t1") -> None:
        self.root, self.name = root, name
        self.proc: subprocess.Popen[bytes] | None = None
        self.client_port = self.peer_port = 0
        self.initial_cluster = ""  # a member of EtcdCluster: every member's name=peer URL
        self.tls: dict[str, Path] | None = None  # ca, cert, key: serve https, require client certs

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.client_port}"

    @property
    def peer(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self, wait: bool = True) -> EtcdServer:
        if not self.client_port:
            self.client_port, self.peer_port = free_port(), free_port()
        self.root.mkdir(parents=True, exist_ok=True)
        client, peer = self.endpoint, f"http://127.0.0.1:{self.peer_port}"
        log = open(self.root / "etcd.log", "ab")
        self.proc = subprocess.Popen(
            ["etcd", "--name", self.name, "--data-dir", str(self.root / "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", self.initial_cluster or f"{self.name}={peer}", "--log-level", "error",
             *([] if not self.tls else ["--cert-file", str(self.tls["cert"]), "--key-file", str(self.tls["key"]),
                                        "--trusted-ca-file", str(self.tls["ca"]), "--client-cert-auth"])],
            stdout=log, stderr=log)
        log.close()
        if wait and not poll(self._healthy, timeout=15):
            raise AssertionError(f"etcd on {client} not healthy within 15 s")
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"etcd exited: {(self.root / 'etcd.log').read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", self.client_port), timeout=0.2):
                pass
        except OSError:
            return False
        from ipam.etcd import Etcd, EtcdConfig, EtcdUnavailable

        tls = self.tls or {}
        config = EtcdConfig((self.endpoint,), str(tls["ca"]) if tls else None,
                            str(tls["client_cert"]) if tls else None, str(tls["client_key"]) if tls else None,
                            timeout=0.5)
        try:
            Etcd(config).get("/health-probe")
        except EtcdUnavailable:
            return False
        return True

    def stop(self) -> None:
        """SIGKILL, as a crash or a node losing power would: only this process, by its pid."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class EtcdCluster:
    """Three (or n) members on loopback, each its own data directory and ports."""

    def __init__(self, root: Path, n: int = 3) -> None:
        self.members = [EtcdServer(root / f"m{i}", f"m{i}") for i in range(n)]
        for m in self.members:
            m.client_port, m.peer_port = free_port(), free_port()
        initial = ",".join(f"{m.name}={m.peer}" for m in self.members)
        for m in self.members:
            m.initial_cluster = initial

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(m.endpoint for m in self.members)

    def start(self) -> EtcdCluster:
        for m in self.members:  # a member alone waits for its peers: start all, then check
            m.start(wait=False)
        for m in self.members:
            if not poll(m._healthy, timeout=20):
                raise AssertionError(f"etcd member {m.name} not healthy within 20 s")
        return self

    def remove(self) -> None:
        for m in self.members:
            m.remove()


def make_test_ca(root: Path) -> dict[str, Path]:
    """A throw-away CA, a server certificate for 127.0.0.1 and a client certificate (openssl)."""
    root.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=root, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=tenantnet-test-ca",
        "-keyout", "ca.key", "-out", "ca.pem")
    (root / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=tenantnet-test-{name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "san.cnf", "-out", f"{name}.pem")
    return {"ca": root / "ca.pem", "cert": root / "server.pem", "key": root / "server.key",
            "client_cert": root / "client.pem", "client_key": root / "client.key"}
