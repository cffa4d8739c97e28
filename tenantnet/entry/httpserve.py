"""tenantnet's one HTTP server, with one set of bounds: the agent's `/metrics`
(tenantnet/entry/metrics.py) and `tenantnetctl offload --listen`
(tenantnet/ops/flowreport/server.py) both serve through it.

Anyone who reaches the port may be hostile, and the agent that serves it also serves the
node's CNI calls under a memory limit. So what a client can make the server hold is bounded
before any application code runs, whatever the client sends:

- **connections**: at most MAX_CONNECTIONS at once, each on a thread of its own (never one of
  the agent's CNI workers). One more is answered `503` and closed by the accepting thread
  at once, without being read;
- **rate**: at most ACCEPTS_PER_SECOND connections are accepted a second (after a burst of
  ACCEPT_BURST); beyond that the server does not call accept(), and the kernel's backlog
  holds or drops the rest at no cost to the agent. Every request costs the agent's
  interpreter a little (≈ 0.3 ms, a refusal too), which its CNI calls share: a client that
  connects in a loop takes at most that rate × that cost from them;
- **request size**: the request line and headers together at most MAX_HEADER_BYTES, read
  into one buffer of that size; more is answered `431` and the connection closed. A request
  body is never read;
- **time**: a request has REQUEST_DEADLINE seconds from its accept to the end of its headers,
  however it trickles them in (a byte a second does not extend it), else `408` and closed;
  the answer has RESPONSE_DEADLINE seconds to be sent to a client that reads slowly;
- **who**: with a token file, the bearer token is checked right after the headers, before
  the route's handler runs (`401`; `503` while the file gives no token);
- GET and HEAD only, one request per connection (`Connection: close`).

So the server holds at most MAX_CONNECTIONS × (a thread, MAX_HEADER_BYTES of headers), a
connection at most REQUEST_DEADLINE + RESPONSE_DEADLINE + LINGER seconds plus its handler's
time, and takes at most ACCEPTS_PER_SECOND requests' worth of CPU a second. The handlers
bound their own work (entry/metrics.py: scrapes at once, a reused body).
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus

MAX_CONNECTIONS = 16
MAX_HEADER_BYTES = 8 << 10
REQUEST_DEADLINE = 5.0
RESPONSE_DEADLINE = 10.0
LINGER = 0.5  # after an answer: how long unread request bytes are drained (so the close is no RST)
LISTEN_BACKLOG = 64
ACCEPTS_PER_SECOND = 32.0  # Prometheus scrapes every 15-60 s; operators' curls are rarer still
ACCEPT_BURST = 32
MAX_TOKEN_BYTES = 4096
_CHUNK = 64 << 10

# Why requests were refused before a handler ran; the keys of `HttpServer.refused`.
REFUSALS = ("over_capacity", "deadline", "headers_too_large", "bad_request", "unauthorized")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: Mapping[str, str]  # names in lower case; the first of repeated ones


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


Handler = Callable[[Request], Response]


def _text(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, message.encode() + b"\n", headers=headers)


def _head_bytes(response: Response, length: int) -> bytes:
    try:
        reason = HTTPStatus(response.status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [f"HTTP/1.1 {response.status} {reason}", f"Content-Type: {response.content_type}",
             f"Content-Length: {length}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in response.headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")


_OVER_CAPACITY = _head_bytes(Response(503, headers=(("Retry-After", "1"),)), 0)


@dataclass
class _Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    accepted: int = 0
    active: int = 0  # connections being served now (at most max_connections)
    answered: int = 0  # requests that reached their route's handler
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSALS, 0))
    cpu: float = 0.0  # of finished connection threads


class HttpServer:
    """Serves `routes` (path → handler) on (host, port) with the module's bounds; `token_file`:
    every route asks for its bearer token (BearerToken). Unknown paths get `404` without a
    token (nothing is served but that the path does not exist).

    The bounds are the module's constants; the keyword arguments exist for tests."""

    def __init__(self, host: str, port: int, routes: Mapping[str, Handler], *, token_file: str = "",
                 name: str = "tenantnet-http", max_connections: int = MAX_CONNECTIONS,
                 max_header_bytes: int = MAX_HEADER_BYTES, request_deadline: float = REQUEST_DEADLINE,
                 response_deadline: float = RESPONSE_DEADLINE, accepts_per_second: float = ACCEPTS_PER_SECOND,
                 accept_burst: int = ACCEPT_BURST, clock: Callable[[], float] = time.monotonic) -> None:
        self.routes = dict(routes)
        self.token = BearerToken(token_file) if token_file else None
        self.name = name
        self.max_connections = max_connections
        self.max_header_bytes = max_header_bytes
        self.request_deadline = request_deadline
        self.response_deadline = response_deadline
        self.pace = _Pace(accepts_per_second, accept_burst, clock)
        self.stats = _Stats()
        self._slots = threading.BoundedSemaphore(max_connections)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(LISTEN_BACKLOG)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._acceptor: int | None = None  # the accepting thread's id, for its CPU clock
        self._acceptor_cpu = 0.0

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    # ---- running ------------------------------------------------------------------------------
    def start(self) -> HttpServer:
        """Serve on a daemon thread of its own."""
        self._thread = threading.Thread(target=self.serve_forever, name=self.name, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Accept until stop() (or, on the main thread, a signal handler that raises)."""
        self._acceptor = threading.get_ident()
        woken, either = select.poll(), select.poll()  # (poll: any descriptor number, unlike select)
        woken.register(self._wake_r, select.POLLIN)
        either.register(self._wake_r, select.POLLIN)
        either.register(self._listener, select.POLLIN)
        try:
            while not self._stopping.is_set():
                wait = self.pace.wait()
                if wait > 0:  # over the rate: only a stop() is noticed until an accept is due
                    if woken.poll(wait * 1000):
                        return
                    continue
                ready = {fd for fd, _ in either.poll()}
                if self._wake_r.fileno() in ready:
                    return
                if self._accept():
                    self.pace.took()
        finally:
            self._acceptor_cpu = time.thread_time()
            self._acceptor = None

    def stop(self) -> None:
        """Stop accepting and close the port; connections in progress end on their deadlines."""
        self._stopping.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.close()

    def close(self) -> None:
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()

    def cpu_seconds(self) -> float:
        """CPU this server's threads have used: the accepting thread, and every connection's
        thread once it has ended (reading, checking, the handler, writing)."""
        acceptor = self._acceptor_cpu
        ident = self._acceptor
        if ident is not None:
            try:
                acceptor = time.clock_gettime(time.pthread_getcpuclockid(ident))
            except (OSError, AttributeError):
                pass
        with self.stats.lock:
            return acceptor + self.stats.cpu

    def _count(self, reason: str) -> None:
        with self.stats.lock:
            self.stats.refused[reason] += 1

    # ---- accepting ----------------------------------------------------------------------------
    def _accept(self) -> bool:
        """Accept one connection and hand it to a thread of its own, or refuse it; False if
        there was none to accept."""
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return False
        except OSError:  # out of descriptors or the like: give the rest of the agent a moment
            time.sleep(0.05)
            return False
        if not self._slots.acquire(blocking=False):
            self._count("over_capacity")
            _refuse(conn)
            return True
        with self.stats.lock:
            self.stats.accepted += 1
            self.stats.active += 1
        try:
            threading.Thread(target=self._connection, args=(conn,), name=f"{self.name}-conn",
                             daemon=True).start()
        except RuntimeError:  # no thread to be had: as if over capacity
            with self.stats.lock:
                self.stats.active -= 1
            self._slots.release()
            self._count("over_capacity")
            _refuse(conn)
        return True

    def _connection(self, conn: socket.socket) -> None:
        started = time.thread_time()
        try:
            self._serve(conn)
        except Exception:  # noqa: S110 (a client's trouble is not the agent's: it is closed)
            pass
        finally:
            conn.close()
            with self.stats.lock:
                self.stats.active -= 1
                self.stats.cpu += time.thread_time() - started
            self._slots.release()

    # ---- one request --------------------------------------------------------------------------
    def _serve(self, conn: socket.socket) -> None:
        deadline = time.monotonic() + self.request_deadline
        head, problem = self._read_head(conn, deadline)
        if head is None:
            if problem == "deadline":
                self._count("deadline")
                self._answer(conn, _text(408, f"the request was not complete within "
                                              f"{self.request_deadline:g} s"))
            elif problem == "too large":
                self._count("headers_too_large")
                self._answer(conn, _text(431, f"request line and headers are limited to "
                                              f"{self.max_header_bytes} bytes"))
            return
        request = _parse(head)
        if isinstance(request, Response):
            self._count("bad_request")
            self._answer(conn, request)
            return
        handler = self.routes.get(request.path)
        if handler is None:
            self._answer(conn, _text(404, "not found"), head_only=request.method == "HEAD")
            return
        if self.token is not None:
            refusal = self.token.refusal(request.headers.get("authorization"))
            if refusal is not None:
                status, why = refusal
                self._count("unauthorized")
                extra = (("WWW-Authenticate", 'Bearer realm="tenantnet-metrics"'),) if status == 401 else ()
                self._answer(conn, _text(status, why, extra), head_only=request.method == "HEAD")
                return
        with self.stats.lock:
            self.stats.answered += 1
        try:
            response = handler(request)
        except Exception as exc:  # an answer, not a traceback on the agent's stderr
            response = _text(500, f"error: {exc}")
        self._answer(conn, response, head_only=request.method == "HEAD")

    def _read_head(self, conn: socket.socket, deadline: float) -> tuple[bytes | None, str]:
        """The request line and headers (without the blank line), or (None, why not): "deadline",
        "too large" or "closed". Reads at most max_header_bytes + 1 bytes."""
        buf = bytearray()
        limit = self.max_header_bytes
        scanned = 0  # the end is looked for in new bytes only (and the 3 before them)
        while True:
            end = _end_of_head(buf, scanned)
            scanned = max(len(buf) - 3, 0)
            if end >= 0:
                return bytes(buf[:end]), ""
            if len(buf) > limit:
                return None, "too large"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None, "deadline"
            conn.settimeout(remaining)
            try:
                chunk = conn.recv(min(_CHUNK, limit + 1 - len(buf)))
            except TimeoutError:
                return None, "deadline"
            except OSError:
                return None, "closed"
            if not chunk:
                return None, "closed"
            buf += chunk

    def _answer(self, conn: socket.socket, response: Response, head_only: bool = False) -> None:
        """Send `response` within response_deadline, then close gently: unread request bytes
        are drained for up to LINGER seconds so the close does not reset the answer away."""
        deadline = time.monotonic() + self.response_deadline
        body = b"" if head_only else response.body
        try:
            for part in (_head_bytes(response, len(response.body)), body):
                view = memoryview(part)
                while view:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    conn.settimeout(remaining)
                    sent = conn.send(view[:_CHUNK])
                    view = view[sent:]
            conn.shutdown(socket.SHUT_WR)
            _drain(conn, min(LINGER, max(deadline - time.monotonic(), 0.0)))
        except OSError:
            return


class _Pace:
    """A token bucket: `rate` accepts a second on average, `burst` at once."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self.rate, self.burst, self._clock = rate, float(burst), clock
        self._tokens, self._at = float(burst), clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def wait(self) -> float:
        """Seconds until an accept is allowed (0: now)."""
        self._refill()
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.rate

    def took(self) -> None:
        self._refill()
        self._tokens -= 1


def _end_of_head(buf: bytearray, start: int = 0) -> int:
    """Where the blank line ending the headers starts (CRLF CRLF, or a bare LF LF), or -1."""
    ends = [i for i in (buf.find(b"\r\n\r\n", start), buf.find(b"\n\n", start)) if i >= 0]
    return min(ends) if ends else -1


def _parse(head: bytes) -> Request | Response:
    lines = head.decode("latin-1").split("\n")
    parts = lines[0].rstrip("\r").split(" ")
    if len(parts) != 3 or not parts[1].startswith("/"):
        return _text(400, "expected a request line: GET /metrics HTTP/1.1")
    method, target, version = parts
    if not version.startswith("HTTP/1."):
        return _text(505, "HTTP/1.x only")
    if method not in ("GET", "HEAD"):
        return _text(405, "GET or HEAD only", (("Allow", "GET, HEAD"),))
    headers: dict[str, str] = {}
    for line in lines[1:]:
        line = line.rstrip("\r")
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return _text(400, "a header line is not `Name: value`")
        headers.setdefault(name.lower(), value.strip())
    path, _, query = target.partition("?")
    return Request(method, path, query, headers)


def _refuse(conn: socket.socket) -> None:
    """Over capacity: a 503 if the socket takes it at once, then closed; nothing waits."""
    try:
        conn.setblocking(False)
        conn.send(_OVER_CAPACITY)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(_CHUNK)  # what has arrived already: closing on unread bytes would reset the 503
    except OSError:
        pass
    finally:
        conn.close()


def _drain(conn: socket.socket, seconds: float) -> None:
    """Read and drop what the client still sends, until it closes, for at most `seconds` and
    _CHUNK bytes."""
    until = time.monotonic() + seconds
    left = _CHUNK
    while left > 0:
        remaining = until - time.monotonic()
        if remaining <= 0:
            return
        conn.settimeout(remaining)
        try:
            data = conn.recv(min(left, 4096))
        except OSError:
            return
        if not data:
            return
        left -= len(data)


# ---- the bearer token ------------------------------------------------------------------------

def read_token(path: str) -> tuple[bytes | None, str]:
    """(the token in `path`, "") or (None, why not): opened without blocking, read only if a
    regular file of at most MAX_TOKEN_BYTES; surrounding whitespace is not part of it."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        return None, exc.strerror or str(exc)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "not a regular file"
        data = os.read(fd, MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        return None, exc.strerror or str(exc)
    finally:
        os.close(fd)
    if len(data) > MAX_TOKEN_BYTES:
        return None, f"larger than {MAX_TOKEN_BYTES} bytes"
    return (data.strip(), "") if data.strip() else (None, "empty")


class BearerToken:
    """The token a request must present, read from the node's `metricsTokenFile`.

    The file is read again whenever it changes (a rotated Kubernetes Secret), so a new token
    applies without restarting the agent. The path is the node admin's, not a tenant's, and
    is followed through symbolic links: kubelet projects a Secret's keys as links into a
    timestamped directory. It is still opened without blocking and read only if it is a
    regular file of at most MAX_TOKEN_BYTES. Fails closed: a missing, unreadable or empty
    file refuses every request (503) rather than serving the metrics to anyone."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int, int] | None = None
        self._token: bytes | None = None
        self._problem = "not read yet"

    def _current(self) -> bytes | None:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            with self._lock:
                self._seen, self._token, self._problem = None, None, exc.strerror or str(exc)
            return None
        sig = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if sig != self._seen:
                self._token, self._problem = read_token(self.path)
                self._seen = sig
            return self._token

    def refusal(self, header: str | None) -> tuple[int, str] | None:
        """None if `header` (the request's Authorization) carries the token; else the HTTP
        status and the reason, which names no part of the token."""
        import hmac

        token = self._current()
        if token is None:
            return 503, f"metricsTokenFile {self.path}: {self._problem}; no scrape is served without a token"
        scheme, _, given = (header or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return 401, "a bearer token is required (Authorization: Bearer <token>)"
        if not hmac.compare_digest(given.strip().encode("latin-1", "replace"), token):
            return 401, "the bearer token is not this node's metrics token"
        return None
