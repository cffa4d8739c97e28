"""Just enough of the Kubernetes API for `tenantnetctl doctor`: GET one object, POST one
review, as the admin's kubeconfig allows.

Two ways, one interface (`KubeApi`): `kubectl` when it is on PATH (`get --raw`, `create --raw
-f -`: every credential kind a kubeconfig can hold, exec plugins included), else a built-in
client over `http.client` that understands what kubeconfigs on nodes hold — a server with
its CA (file or data), client certificates (file or data), a bearer token (inline or file) —
and the in-cluster ServiceAccount. A kubeconfig it cannot use (an exec or auth-provider
plugin) is `KubeUnavailable` naming why, so the doctor says SKIP with that reason instead of
guessing.

Every read of a file is bounded and non-blocking (O_NOFOLLOW | O_NONBLOCK, a size cap); every
request and every kubectl run has a time-out.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import urllib.parse
from dataclasses import dataclass
from typing import Any, Protocol

MAX_FILE = 1 << 20  # a kubeconfig with a few embedded certificates is a few kB
MAX_ANSWER = 4 << 20  # one CRD (with its schema) or one review
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class KubeUnavailable(Exception):
    """No usable configuration, or the API server could not be reached: the checks that
    need it say SKIP with this message."""


@dataclass(frozen=True)
class Answer:
    status: int  # the HTTP status (200, 403, 404, …)
    body: dict[str, Any]
    text: str = ""  # the server's words when the body is not JSON (kubectl's stderr)


@dataclass(frozen=True)
class Identity:
    """Who to ask as (impersonation): a user and its groups."""

    user: str
    groups: tuple[str, ...] = ()

    @classmethod
    def service_account(cls, namespace: str, name: str) -> Identity:
        return cls(f"system:serviceaccount:{namespace}:{name}",
                   ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"))


class KubeApi(Protocol):
    source: str  # what is used, for the report: "kubectl with /root/.kube/config"

    def get(self, path: str) -> Answer: ...

    def post(self, path: str, body: dict[str, Any], as_identity: Identity | None = None) -> Answer: ...


def read_bounded(path: str, cap: int = MAX_FILE) -> bytes:
    """A regular file's bytes (at most `cap`), opened without following a symlink and without
    waiting on a FIFO; OSError naming the path otherwise."""
    fd = os.open(path, _OPEN)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        data = os.read(fd, cap + 1)
    finally:
        os.close(fd)
    if len(data) > cap:
        raise OSError(f"{path} is larger than {cap} bytes")
    return data


def _describe(exc: OSError) -> str:
    return exc.strerror if exc.strerror else str(exc)


# ---- where the configuration comes from -----------------------------------------------------

def find_kubeconfig(given: str | None, environ: dict[str, str]) -> tuple[str | None, str]:
    """(path, why) of the kubeconfig to use: --kubeconfig, else $KUBECONFIG's first existing
    file, else ~/.kube/config, else /etc/kubernetes/admin.conf; (None, "in-cluster") inside a
    pod with a ServiceAccount; (None, reason) when there is none."""
    if given:
        return given, "--kubeconfig"
    for item in (environ.get("KUBECONFIG") or "").split(":"):
        if item and os.path.isfile(item):
            return item, "$KUBECONFIG"
    home = environ.get("HOME") or os.path.expanduser("~")
    for candidate in (os.path.join(home, ".kube", "config"), "/etc/kubernetes/admin.conf"):
        if os.path.isfile(candidate):
            return candidate, "found"
    if environ.get("KUBERNETES_SERVICE_HOST") and os.path.isfile(os.path.join(SA_DIR, "token")):
        return None, "in-cluster"
    return None, ("no kubeconfig (no --kubeconfig, no $KUBECONFIG, no ~/.kube/config or "
                  "/etc/kubernetes/admin.conf, not in a pod)")


def connect(kubeconfig: str | None, how: str, timeout: float, prefer: str = "auto",
            environ: dict[str, str] | None = None) -> KubeApi:
    """The client: kubectl (prefer "kubectl", or "auto" with kubectl on PATH) or the built-in
    one. KubeUnavailable when neither can be used with this configuration."""
    environ = dict(os.environ if environ is None else environ)
    if kubeconfig is None and how != "in-cluster":
        raise KubeUnavailable(how)  # kubectl too would only try localhost:8080
    kubectl = shutil.which("kubectl", path=environ.get("PATH")) if prefer in ("auto", "kubectl") else None
    if prefer == "kubectl" and kubectl is None:
        raise KubeUnavailable("kubectl is not on PATH")
    if kubectl is not None:
        return Kubectl(kubectl, kubeconfig, timeout, environ)
    if kubeconfig is None:
        return BuiltinClient.in_cluster(timeout)
    return BuiltinClient.from_kubeconfig(kubeconfig, timeout)


# ---- kubectl --------------------------------------------------------------------------------

_STATUS_WORDS = {"NotFound": 404, "Forbidden": 403, "Unauthorized": 401, "BadRequest": 400,
                 "MethodNotAllowed": 405, "Conflict": 409, "Invalid": 422}


class Kubectl:
    def __init__(self, binary: str, kubeconfig: str | None, timeout: float, environ: dict[str, str]) -> None:
        self.binary, self.kubeconfig, self.timeout, self.environ = binary, kubeconfig, timeout, environ
        self.source = f"kubectl ({binary}) with {kubeconfig or 'in-cluster config'}"

    def _run(self, args: list[str], stdin: bytes = b"") -> Answer:
        argv = [self.binary, *(["--kubeconfig", self.kubeconfig] if self.kubeconfig else []),
                f"--request-timeout={max(1, int(self.timeout))}s", *args]
        code, out, err = run_bounded(argv, self.timeout + 2, stdin=stdin, env=self.environ)
        if code is None:
            raise KubeUnavailable(f"kubectl did not finish within {self.timeout + 2:g}s")
        text = err.decode(errors="replace").strip()
        if code == 0:
            try:
                body = json.loads(out)
            except ValueError:
                raise KubeUnavailable(f"kubectl answered something that is not JSON: {out[:200]!r}") from None
            return Answer(200, body if isinstance(body, dict) else {})
        m = re.search(r"Error from server \((\w+)\)", text)
        if m and m[1] in _STATUS_WORDS:
            return Answer(_STATUS_WORDS[m[1]], {}, text)
        # Anything else is kubectl not reaching a server (connection refused, certificates…).
        raise KubeUnavailable(f"kubectl failed: {text.splitlines()[-1] if text else f'exit {code}'}")

    def get(self, path: str) -> Answer:
        return self._run(["get", "--raw", path])

    def post(self, path: str, body: dict[str, Any], as_identity: Identity | None = None) -> Answer:
        args = ["create", "--raw", path, "-f", "-"]
        if as_identity is not None:
            args += [f"--as={as_identity.user}", *(f"--as-group={g}" for g in as_identity.groups)]
        return self._run(args, json.dumps(body).encode())


def run_bounded(argv: list[str], timeout: float, *, stdin: bytes = b"", env: dict[str, str] | None = None,
                cap: int = MAX_ANSWER) -> tuple[int | None, bytes, bytes]:
    """(exit code, stdout, stderr) of `argv`, each output at most `cap` bytes; (None, …) when it
    did not finish within `timeout` — then it and its session are killed (it was started in a
    session of its own, so nothing else is)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err, env=env,
                                    start_new_session=True, close_fds=True)
        except OSError as exc:
            return 127, b"", f"cannot run {argv[0]}: {_describe(exc)}".encode()
        try:
            try:
                proc.communicate(stdin, timeout=timeout)
            except subprocess.TimeoutExpired:
                import signal

                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: only what it started
                except OSError:
                    pass
                proc.wait()
                return None, b"", b""
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read(cap), err.read(cap)


# ---- the built-in client --------------------------------------------------------------------

@dataclass(frozen=True)
class Credentials:
    server: str
    ca_pem: str | None = None
    insecure: bool = False
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    token: str | None = None


def _field_bytes(entry: dict[str, Any], key: str, base: str) -> bytes | None:
    """`key-data` (base64) or the file `key` names (relative to the kubeconfig's directory)."""
    import base64

    data = entry.get(f"{key}-data")
    if isinstance(data, str) and data:
        try:
            return base64.b64decode(data, validate=False)
        except ValueError:
            raise KubeUnavailable(f"{key}-data is not base64") from None
    path = entry.get(key)
    if isinstance(path, str) and path:
        full = path if os.path.isabs(path) else os.path.join(base, path)
        try:
            return read_bounded(os.path.realpath(full))
        except OSError as exc:
            raise KubeUnavailable(f"cannot read {key} {full}: {_describe(exc)}") from None
    return None


def credentials_from_kubeconfig(path: str) -> Credentials:
    """The current context's server and credentials; KubeUnavailable naming what is missing
    or not supported."""
    import yaml

    try:
        # The admin named it (or it is a conventional path): a symlink to it is theirs.
        data = yaml.safe_load(read_bounded(os.path.realpath(path)))
    except OSError as exc:
        raise KubeUnavailable(f"cannot read kubeconfig {path}: {_describe(exc)}") from None
    except yaml.YAMLError as exc:
        raise KubeUnavailable(f"kubeconfig {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise KubeUnavailable(f"kubeconfig {path} is not a mapping")

    def named(section: str, name: Any) -> dict[str, Any]:
        for item in data.get(section) or []:
            if isinstance(item, dict) and item.get("name") == name:
                inner = item.get(section[:-1])
                return inner if isinstance(inner, dict) else {}
        raise KubeUnavailable(f"kubeconfig {path}: no {section[:-1]} named {name!r}")

    current = data.get("current-context")
    contexts = data.get("contexts") or []
    if not current and len(contexts) == 1 and isinstance(contexts[0], dict):
        current = contexts[0].get("name")
    if not current:
        raise KubeUnavailable(f"kubeconfig {path} has no current-context")
    context = named("contexts", current)
    cluster = named("clusters", context.get("cluster"))
    user = named("users", context.get("user")) if context.get("user") else {}
    base = os.path.dirname(os.path.abspath(path))
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeUnavailable(f"kubeconfig {path}: cluster {context.get('cluster')!r} has no https:// server")
    for unsupported in ("exec", "auth-provider"):
        if user.get(unsupported):
            raise KubeUnavailable(f"kubeconfig {path}: user {context.get('user')!r} authenticates through an "
                                  f"{unsupported} plugin, which only kubectl runs (put kubectl on PATH)")
    ca = _field_bytes(cluster, "certificate-authority", base)
    token = user.get("token") if isinstance(user.get("token"), str) else None
    if not token and isinstance(user.get("tokenFile"), str):
        token_bytes = _field_bytes({"t": user["tokenFile"]}, "t", base)
        token = token_bytes.decode(errors="replace").strip() if token_bytes else None
    return Credentials(server=server.rstrip("/"), ca_pem=ca.decode(errors="replace") if ca else None,
                       insecure=bool(cluster.get("insecure-skip-tls-verify")),
                       cert_pem=_field_bytes(user, "client-certificate", base),
                       key_pem=_field_bytes(user, "client-key", base), token=token)


class BuiltinClient:
    def __init__(self, creds: Credentials, timeout: float, source: str) -> None:
        self.creds, self.timeout = creds, timeout
        self.source = source
        self._ssl: Any = None

    @classmethod
    def from_kubeconfig(cls, path: str, timeout: float) -> BuiltinClient:
        return cls(credentials_from_kubeconfig(path), timeout, f"built-in client with {path}")

    @classmethod
    def in_cluster(cls, timeout: float) -> BuiltinClient:
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        try:
            token = read_bounded(os.path.join(SA_DIR, "token")).decode().strip()
            ca = read_bounded(os.path.join(SA_DIR, "ca.crt")).decode()
        except (OSError, UnicodeDecodeError) as exc:
            raise KubeUnavailable(f"in-cluster ServiceAccount files unreadable: {exc}") from None
        server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        return cls(Credentials(server, ca_pem=ca, token=token), timeout, "built-in client, in-cluster")

    def _context(self) -> Any:
        import ssl

        if self._ssl is not None:
            return self._ssl
        ctx = ssl.create_default_context(cadata=self.creds.ca_pem) if self.creds.ca_pem \
            else ssl.create_default_context()
        if self.creds.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.creds.cert_pem and self.creds.key_pem:
            # ssl loads a certificate chain only from files: a private directory, removed at once.
            with tempfile.TemporaryDirectory(prefix="tenantnet-doctor-") as tmp:
                cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
                for name, data in ((cert, self.creds.cert_pem), (key, self.creds.key_pem)):
                    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(data)
                try:
                    ctx.load_cert_chain(cert, key)
                except ssl.SSLError as exc:
                    raise KubeUnavailable(f"the client certificate or key is unusable: {exc}") from None
        self._ssl = ctx
        return ctx

    def _request(self, method: str, path: str, body: bytes | None, headers: list[tuple[str, str]]) -> Answer:
        import http.client

        url = urllib.parse.urlsplit(self.creds.server)
        try:
            if url.scheme == "https":
                conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                    url.hostname or "", url.port or 443, timeout=self.timeout, context=self._context())
            else:
                conn = http.client.HTTPConnection(url.hostname or "", url.port or 80, timeout=self.timeout)
            heads = [("Accept", "application/json"), *headers]
            if body is not None:
                heads += [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
            if self.creds.token:
                heads.append(("Authorization", f"Bearer {self.creds.token}"))
            try:
                # putheader, not request(headers=dict): impersonation repeats Impersonate-Group.
                conn.putrequest(method, (url.path or "") + path, skip_accept_encoding=True)
                for key, value in heads:
                    conn.putheader(key, value)
                conn.endheaders(body)
                resp = conn.getresponse()
                data = resp.read(MAX_ANSWER + 1)
            finally:
                conn.close()
        except (OSError, http.client.HTTPException) as exc:
            raise KubeUnavailable(f"cannot reach the API server {self.creds.server}: "
                                  f"{exc if not isinstance(exc, OSError) else _describe(exc)}") from None
        if len(data) > MAX_ANSWER:
            raise KubeUnavailable(f"the API server's answer to {path} is larger than {MAX_ANSWER} bytes")
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            return Answer(resp.status, {}, data[:500].decode(errors="replace"))
        return Answer(resp.status, parsed, str(parsed.get("message", "")))

    def get(self, path: str) -> Answer:
        return self._request("GET", path, None, [])

    def post(self, path: str, body: dict[str, Any], as_identity: Identity | None = None) -> Answer:
        headers: list[tuple[str, str]] = []
        if as_identity is not None:
            headers.append(("Impersonate-User", as_identity.user))
            headers += [("Impersonate-Group", g) for g in as_identity.groups]
        return self._request("POST", path, json.dumps(body).encode(), headers)
