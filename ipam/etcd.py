"""A small etcd v3 client over etcd's JSON gateway (`/v3/...`), standard library only.

Why not a library: `etcd3gw` (the gateway client) pulls in `requests` and `futurist`
(≈ 60 ms of imports, paid by every in-process IPAM call), and the gRPC clients need grpcio
and protobuf (tens of MB, and `etcd3` has been unmaintained since 2020). What tenantnet-ipam
needs is six calls — range, put, a compare-and-swap transaction, delete, lease grant and
keepalive — each one HTTP POST of a small JSON document; `http.client` does that with a
time-out per request, TLS with client certificates through `ssl`, and one kept-alive
connection per endpoint. docs/ipam.md ("Cluster mode") has the argument in full.

Every call has one deadline across all endpoints: the endpoints are tried in turn (the one
that answered last first), and when none answers in time the call raises `EtcdUnavailable`
— never a hang. Keys and values are bytes on the wire (base64 in the JSON); keys are `str`
here, values `bytes`.
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ssl

MAX_RESPONSE = 16 << 20  # a range over one network's blocks is a few hundred kB at most


class EtcdUnavailable(Exception):
    """No endpoint answered within the deadline (down, partitioned, no quorum)."""


class EtcdError(Exception):
    """An endpoint answered with an error (bad request, permission, TLS refused...)."""


@dataclass(frozen=True)
class EtcdConfig:
    endpoints: tuple[str, ...]  # http://host:port or https://host:port
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    # Seconds per call, all endpoints together: longer than etcd's leader election (≈ 1 s by
    # default, more on a loaded machine), so losing one member of three fails no call.
    timeout: float = 5.0


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def _kv(item: dict[str, Any]) -> KeyValue:
    return KeyValue(key=base64.b64decode(item.get("key", "")).decode(),
                    value=base64.b64decode(item.get("value", "")),
                    create_revision=int(item.get("create_revision", 0)),
                    mod_revision=int(item.get("mod_revision", 0)), lease=int(item.get("lease", 0)))


def prefix_end(prefix: str) -> bytes:
    """The range end that covers every key starting with `prefix` (etcd's convention: the
    prefix's bytes with the last one incremented)."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return b"\0"
    raw[-1] += 1
    return bytes(raw)


def absent(key: str) -> dict[str, Any]:
    """A transaction's compare: `key` does not exist."""
    return {"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}


def value_is(key: str, value: bytes) -> dict[str, Any]:
    """A transaction's compare: `key` holds exactly `value` (false when it does not exist)."""
    return {"key": _b64(key), "result": "EQUAL", "target": "VALUE", "value": _b64(value)}


def unchanged_since(prefix: str, revision: int) -> dict[str, Any]:
    """A transaction's compare: no key under `prefix` was created or modified after
    `revision` (etcd ≥ 3.3 compares every key of a range; an empty range holds). A key
    deleted since does not count."""
    return {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix)), "result": "LESS", "target": "MOD",
            "mod_revision": str(revision + 1)}


def put_op(key: str, value: bytes) -> dict[str, Any]:
    """A transaction's request: put `key`."""
    return {"request_put": {"key": _b64(key), "value": _b64(value)}}


class Etcd:
    """One client per process and configuration; safe to share between threads."""

    def __init__(self, config: EtcdConfig) -> None:
        if not config.endpoints:
            raise ValueError("no etcd endpoints")
        self.config = config
        self._lock = threading.Lock()
        self._preferred = 0
        self._local = threading.local()
        self._ssl: ssl.SSLContext | None = None
        if any(e.startswith("https://") for e in config.endpoints):
            import ssl  # ≈ 10 ms: only for a TLS cluster store

            self._ssl = ssl.create_default_context(cafile=config.ca_file)
            if config.cert_file:
                self._ssl.load_cert_chain(config.cert_file, config.key_file)

    # ---- transport ----------------------------------------------------------------------
    def _connection(self, endpoint: str, timeout: float) -> http.client.HTTPConnection:
        conns: dict[str, http.client.HTTPConnection] = getattr(self._local, "conns", None) or {}
        self._local.conns = conns
        conn = conns.get(endpoint)
        if conn is None:
            url = urllib.parse.urlsplit(endpoint)
            if url.scheme == "https":
                conn = http.client.HTTPSConnection(url.hostname or "", url.port or 2379, timeout=timeout,
                                                   context=self._ssl)
            else:
                conn = http.client.HTTPConnection(url.hostname or "", url.port or 2379, timeout=timeout)
            conns[endpoint] = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _drop(self, endpoint: str) -> None:
        conns: dict[str, http.client.HTTPConnection] = getattr(self._local, "conns", None) or {}
        conn = conns.pop(endpoint, None)
        if conn is not None:
            conn.close()

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `body` to `path` on the first endpoint that answers before the deadline."""
        deadline = time.monotonic() + self.config.timeout
        endpoints = self.config.endpoints
        with self._lock:
            first = self._preferred
        tried: dict[str, str] = {}  # endpoint -> why it failed last
        refused_tls: set[str] = set()  # a TLS refusal is not retried: it would only repeat
        payload = json.dumps(body).encode()
        # Round after round over the endpoints until the deadline: a member that is down
        # refuses at once, and during a leader election (≈ 1 s after the leader died) the
        # others answer "no leader" at once too — the next round, a moment later, finds the
        # new leader, so losing one member of three fails no call.
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if attempt and attempt % len(endpoints) == 0:  # a round failed: a pause, then the next
                time.sleep(min(left, 0.05 * (1 << min(attempt // len(endpoints), 4))))
                left = deadline - time.monotonic()
                if left <= 0:
                    break
            index = (first + attempt) % len(endpoints)
            attempt += 1
            endpoint = endpoints[index]
            if endpoint in refused_tls:
                if len(refused_tls) == len(endpoints):
                    break
                continue
            try:
                # One attempt gets a share of the deadline, not all of it: a request a follower
                # is forwarding when the leader dies gets no answer before etcd's own request
                # timeout (≈ 7 s), while the other members answer after the election (≈ 1 s).
                # Repeating a request on the next endpoint is safe for every call made here
                # (range, put, create-if-absent, delete-if-value, leases).
                conn = self._connection(endpoint, min(left, max(1.0, self.config.timeout / 3)))
                conn.request("POST", path, payload, {"Content-Type": "application/json"})
                response = conn.getresponse()
                data = response.read(MAX_RESPONSE + 1)
            except (OSError, http.client.HTTPException) as exc:
                self._drop(endpoint)
                hint = self._tls_hint(exc)
                tried[endpoint] = f"{exc}{hint}"
                if hint:
                    refused_tls.add(endpoint)
                continue
            if len(data) > MAX_RESPONSE:
                self._drop(endpoint)
                raise EtcdError(f"etcd at {endpoint}: answer over {MAX_RESPONSE} bytes")
            try:
                answer = json.loads(data)
            except ValueError:
                answer = {"error": data[:200].decode("utf-8", "replace")}
            if response.status == 503 or "no leader" in str(answer.get("error", "")):
                tried[endpoint] = str(answer.get("error") or response.reason)
                continue  # a member without quorum: another one may have it
            if response.status != 200:
                raise EtcdError(f"etcd at {endpoint} refused {path}: HTTP {response.status}: "
                                f"{answer.get('error') or answer.get('message') or response.reason}")
            with self._lock:
                self._preferred = index
            return answer  # type: ignore[no-any-return]
        reasons = "; ".join(f"{e}: {why}" for e, why in tried.items())
        raise EtcdUnavailable(f"no etcd endpoint answered within {self.config.timeout:g} s"
                              + (f" ({reasons})" if reasons else ""))

    def _tls_hint(self, exc: BaseException) -> str:
        """What to check when the TLS handshake failed (the server's reason is often only an
        alert or a closed connection)."""
        if self._ssl is None or not isinstance(exc, OSError) or type(exc).__module__ != "ssl":
            return ""
        if self.config.cert_file:
            return " — TLS refused: check etcdCaFile against etcd's CA, and that etcd trusts etcdCertFile"
        return " — TLS refused: check etcdCaFile, and set etcdCertFile/etcdKeyFile if etcd requires client " \
               "certificates"

    def close(self) -> None:
        for endpoint in list(getattr(self._local, "conns", {}) or {}):
            self._drop(endpoint)

    # ---- key-value ----------------------------------------------------------------------
    def get(self, key: str) -> KeyValue | None:
        kvs = self.call("/v3/kv/range", {"key": _b64(key)}).get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    def range(self, prefix: str) -> list[KeyValue]:
        """Every key under `prefix`, in key order."""
        return self.range_at(prefix)[0]

    def range_at(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under `prefix`, and the store's revision they were read at (what a later
        transaction compares against: `unchanged_since`)."""
        answer = self.call("/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))})
        revision = int((answer.get("header") or {}).get("revision", 0))
        return [_kv(item) for item in answer.get("kvs") or []], revision

    def txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]]) -> bool:
        """One transaction: `success` runs only if every `compare` holds; whether it ran.
        The pieces come from `absent`, `value_is`, `unchanged_since` and `put_op`."""
        return bool(self.call("/v3/kv/txn", {"compare": compare, "success": success}).get("succeeded"))

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        self.call("/v3/kv/put", body)

    def create(self, key: str, value: bytes, lease: int = 0) -> bool:
        """Put `key` only if it does not exist (one transaction); whether it was created."""
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        answer = self.call("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": put}]})
        return bool(answer.get("succeeded"))

    def create_guarded(self, key: str, value: bytes, guard: str, guard_value: bytes) -> bool:
        """Create `key` only if it does not exist and `guard` holds exactly `guard_value`, and
        rewrite `guard` (same value) in the same transaction, so that its mod revision moves:
        whoever changes `guard` with `put_if_revision` meanwhile fails (one transaction)."""
        answer = self.call("/v3/kv/txn", {
            "compare": [
                {"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"},
                {"key": _b64(guard), "result": "EQUAL", "target": "VALUE", "value": _b64(guard_value)}],
            "success": [{"request_put": {"key": _b64(key), "value": _b64(value)}},
                        {"request_put": {"key": _b64(guard), "value": _b64(guard_value)}}]})
        return bool(answer.get("succeeded"))

    def put_if_revision(self, key: str, value: bytes, mod_revision: int) -> bool:
        """Put `key` only if its mod revision is still `mod_revision` (0: it does not exist)."""
        answer = self.call("/v3/kv/txn", {
            "compare": [
                {"key": _b64(key), "result": "EQUAL", "target": "MOD", "mod_revision": str(mod_revision)}],
            "success": [{"request_put": {"key": _b64(key), "value": _b64(value)}}]})
        return bool(answer.get("succeeded"))

    def delete_if(self, key: str, value: bytes) -> bool:
        """Delete `key` only if it holds exactly `value`; whether it was deleted."""
        answer = self.call("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "result": "EQUAL", "target": "VALUE", "value": _b64(value)}],
            "success": [{"request_delete_range": {"key": _b64(key)}}]})
        return bool(answer.get("succeeded"))

    def delete(self, key: str) -> None:
        self.call("/v3/kv/deleterange", {"key": _b64(key)})

    # ---- leases -------------------------------------------------------------------------
    def lease_grant(self, ttl: int) -> int:
        return int(self.call("/v3/lease/grant", {"TTL": str(ttl)})["ID"])

    def lease_keepalive(self, lease: int) -> int:
        """Refresh `lease`; its remaining TTL (0: it had expired)."""
        answer = self.call("/v3/lease/keepalive", {"ID": str(lease)})
        return int((answer.get("result") or {}).get("TTL", 0))

    def lease_revoke(self, lease: int) -> None:
        self.call("/v3/kv/lease/revoke", {"ID": str(lease)})
