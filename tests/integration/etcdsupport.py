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

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self) -> EtcdServer:
        if not self.client_port:
            self.client_port, self.peer_port = free_port(), free_port()
        self.root.mkdir(parents=True, exist_ok=True)
        client, peer = self.endpoint, f"http://127.0.0.1:{self.peer_port}"
        log = open(self.root / "etcd.log", "ab")
        self.proc = subprocess.Popen(
            ["etcd", "--name", self.name, "--data-dir", str(self.root / "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"{self.name}={peer}", "--log-level", "error"],
            stdout=log, stderr=log)
        log.close()
        if not poll(self._healthy, timeout=15):
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

        try:
            Etcd(EtcdConfig((self.endpoint,), timeout=0.5)).get("/health-probe")
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

