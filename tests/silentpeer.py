"""A server that accepts connections and never answers: what a hung or partitioned etcd
member looks like to a client (a refused connection would fail at once). Shared by the
unit and integration tests of pre-warm's cluster side."""

from __future__ import annotations

import socket
import threading


class SilentEtcd:
    """Listens on a free loopback port; every connection is held open, never read or answered."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = int(self.listener.getsockname()[1])
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()
