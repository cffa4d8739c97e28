"""The lab's kubelet pod-resources server — a simulation, labelled as one.

There is no kubelet in the lab, so this stands in for the one thing of it the agent asks: the
pod-resources gRPC service `v1.PodResourcesLister` on a unix socket, answering `List` and
`Get` as the kubelet does (`pkg/kubelet/apis/podresources/server_v1.go`), from a JSON file
that says which pod's containers hold which devices:

```json
{"pods": [{"namespace": "team-a", "name": "train-0",
           "containers": [{"name": "main",
                           "devices": [{"resourceName": "nvidia.com/gpu",
                                        "deviceIds": ["GPU-…"], "numaNodes": [0]}]}]}]}
```

The file is read again whenever it changes (inode, size or mtime; `add_pod`, `add_pod_devices`
and `remove_pod` replace it atomically under a lock file, so a reader never sees half of one),
and a missing file means no pods. The kubelet's variants of Get are selectable: `enabled`
(1.34+, or the gate on), `disabled` (1.27–1.33 with the gate off: UNKNOWN "PodResources API
Get method disabled"), `absent` (before 1.27: not registered, so gRPC answers UNIMPLEMENTED).
Get for an unknown pod answers UNKNOWN "pod … not found", as the kubelet does. `delay` holds
every answer back that long (a stalled kubelet, for timeouts). Messages are encoded with the
plugin's own codec (`tenantnet.plugin.system.podresources`): what this server gets right is
the transport and the kubelet's behaviour, not an independent check of the wire format (the
unit tests do that against hand-computed bytes).

In-process: `start(socket, pods_file)` → a `SimulatedKubelet` (gRPC's own worker threads) with
`stop()`. As a background process: `python -m tenantnet.lab.podresources --socket S --pods F`
(prints `ready <socket>` once it listens, stops on SIGTERM/SIGINT and removes its socket), or
`spawn(...)`, which starts that and waits for `ready`.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from tenantnet.plugin.system import podresources as wire
from tenantnet.plugin.system.podresources import ContainerDevices, ContainerResources, PodResources

GET_MODES = ("enabled", "disabled", "absent")
_FILE_LIMIT = 16 * 1024 * 1024


class PodsFileError(Exception):
    """The simulation's pods file is not what it should be; the message names the file and why."""


# -- the pods file --------------------------------------------------------------------------


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PodsFileError(f"{where}: a list of strings, not {value!r}")
    return tuple(value)


def _ints(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool)
                                              for v in value):
        raise PodsFileError(f"{where}: a list of integers, not {value!r}")
    return tuple(value)


def _pod_from_json(entry: Any, where: str) -> PodResources:
    if not isinstance(entry, dict) or not isinstance(entry.get("namespace"), str) \
            or not isinstance(entry.get("name"), str):
        raise PodsFileError(f"{where}: an object with string namespace and name")
    containers = []
    for i, c in enumerate(entry.get("containers", [])):
        cw = f"{where}.containers[{i}]"
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise PodsFileError(f"{cw}: an object with a string name")
        devices = []
        for j, d in enumerate(c.get("devices", [])):
            dw = f"{cw}.devices[{j}]"
            if not isinstance(d, dict) or not isinstance(d.get("resourceName"), str):
                raise PodsFileError(f"{dw}: an object with a string resourceName")
            devices.append(ContainerDevices(d["resourceName"],
                                            _strings(d.get("deviceIds", []), f"{dw}.deviceIds"),
                                            _ints(d.get("numaNodes", []), f"{dw}.numaNodes")))
        containers.append(ContainerResources(c["name"], tuple(devices)))
    return PodResources(entry["namespace"], entry["name"], tuple(containers))


def _pod_to_json(pod: PodResources) -> dict[str, Any]:
    return {"namespace": pod.namespace, "name": pod.name, "containers": [
        {"name": c.name, "devices": [
            {"resourceName": d.resource_name, "deviceIds": list(d.device_ids),
             "numaNodes": list(d.numa_nodes)} for d in c.devices]}
        for c in pod.containers]}


def parse_pods(text: str | bytes, path: str = "pods file") -> list[PodResources]:
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise PodsFileError(f"{path}: not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("pods", []), list):
        raise PodsFileError(f'{path}: an object {{"pods": [...]}}')
    return [_pod_from_json(p, f"{path}: pods[{i}]") for i, p in enumerate(doc.get("pods", []))]


def read_pods(path: str | os.PathLike[str]) -> list[PodResources]:
    """The pods in the file; none if it does not exist."""
    try:
        with open(path, "rb") as f:
            data = f.read(_FILE_LIMIT + 1)
    except FileNotFoundError:
        return []
    if len(data) > _FILE_LIMIT:
        raise PodsFileError(f"{path}: over {_FILE_LIMIT} bytes")
    return parse_pods(data, os.fspath(path))


def write_pods(path: str | os.PathLike[str], pods: Iterable[PodResources]) -> None:
    """Replace the file with these pods, atomically (a temporary file renamed over it)."""
    path = os.fspath(path)
    text = json.dumps({"pods": [_pod_to_json(p) for p in pods]}, indent=1) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=".pods-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with _quiet():
            os.unlink(tmp)
        raise


@contextmanager
def _quiet() -> Iterator[None]:
    try:
        yield
    except OSError:
        pass


@contextmanager
def _locked(path: str | os.PathLike[str]) -> Iterator[list[PodResources]]:
    """The file's pods, under an exclusive lock on `<path>.lock`, for a read-modify-write."""
    with open(os.fspath(path) + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield read_pods(path)


def add_pod(path: str | os.PathLike[str], pod: PodResources) -> None:
    """Put the pod in the file, replacing an entry of the same namespace/name."""
    with _locked(path) as pods:
        write_pods(path, [p for p in pods if (p.namespace, p.name) != (pod.namespace, pod.name)]
                   + [pod])


def add_pod_devices(path: str | os.PathLike[str], namespace: str, name: str, container: str,
                    resource_name: str, device_ids: Sequence[str],
                    numa_nodes: Sequence[int] = ()) -> None:
    """Give the pod's container these devices (creating the pod and container if needed)."""
    group = ContainerDevices(resource_name, tuple(device_ids), tuple(numa_nodes))
    with _locked(path) as pods:
        pod = next((p for p in pods if (p.namespace, p.name) == (namespace, name)),
                   PodResources(namespace, name))
        containers = list(pod.containers)
        for i, c in enumerate(containers):
            if c.name == container:
                containers[i] = replace(c, devices=c.devices + (group,))
                break
        else:
            containers.append(ContainerResources(container, (group,)))
        pod = replace(pod, containers=tuple(containers))
        write_pods(path, [p for p in pods if (p.namespace, p.name) != (namespace, name)] + [pod])


def remove_pod(path: str | os.PathLike[str], namespace: str, name: str) -> bool:
    """Take the pod out of the file; False if it was not there."""
    with _locked(path) as pods:
        kept = [p for p in pods if (p.namespace, p.name) != (namespace, name)]
        if len(kept) == len(pods):
            return False
        write_pods(path, kept)
        return True


class _PodsView:
    """The file's pods, read again when the file changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int, int] | None = None
        self._pods: list[PodResources] = []

    def pods(self) -> list[PodResources]:
        try:
            st = os.stat(self.path)
            seen = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            seen = None
        with self._lock:
            if seen is None:
                self._seen, self._pods = None, []
            elif seen != self._seen:
                self._pods = read_pods(self.path)
                self._seen = seen
            return self._pods


# -- the server -----------------------------------------------------------------------------


class SimulatedKubelet:
    """A simulated kubelet pod-resources server on `socket_path`, answering from `pods_file`."""

    def __init__(self, socket_path: str | os.PathLike[str], pods_file: str | os.PathLike[str], *,
                 get: str = "enabled", delay: float = 0.0, max_workers: int = 4) -> None:
        if get not in GET_MODES:
            raise ValueError(f"get={get!r}: one of {', '.join(GET_MODES)}")
        self.socket_path = os.path.abspath(os.fspath(socket_path))
        self.pods_file = os.fspath(pods_file)
        self.get = get
        self.delay = delay
        self.max_workers = max_workers
        self.calls: dict[str, int] = {"List": 0, "Get": 0}   # calls received, per method
        self._calls_lock = threading.Lock()
        self._view = _PodsView(self.pods_file)
        self._server: Any = None

    def start(self) -> SimulatedKubelet:
        from concurrent.futures import ThreadPoolExecutor

        import grpc

        if self._server is not None:
            return self
        where = f"simulated kubelet: cannot listen on {self.socket_path}"
        with _quiet():
            if stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                os.unlink(self.socket_path)  # a stale socket of an earlier run
        directory = os.path.dirname(self.socket_path)
        if not os.path.isdir(directory):
            raise OSError(f"{where}: no directory {directory}")
        if os.path.lexists(self.socket_path):
            raise OSError(f"{where}: a file that is not a socket is in the way")
        handlers = {"List": grpc.unary_unary_rpc_method_handler(self._list)}
        if self.get != "absent":
            handlers["Get"] = grpc.unary_unary_rpc_method_handler(self._get)
        server = grpc.server(ThreadPoolExecutor(max_workers=self.max_workers,
                                                thread_name_prefix="sim-kubelet"))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(wire.SERVICE, handlers),))
        try:
            bound = server.add_insecure_port("unix:" + self.socket_path)
        except RuntimeError as e:  # recent grpcio raises where older ones returned 0
            raise OSError(f"{where}: {e}") from None
        if bound == 0:
            raise OSError(where)
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=None).wait()
        with _quiet():
            if stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                os.unlink(self.socket_path)

    def __enter__(self) -> SimulatedKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _pods(self, context: Any) -> list[PodResources]:
        import grpc

        try:
            return self._view.pods()
        except PodsFileError as e:
            context.abort(grpc.StatusCode.INTERNAL, f"simulated kubelet: {e}")
            raise  # abort raises; for the type checker

    def _count(self, method: str) -> None:
        with self._calls_lock:
            self.calls[method] += 1
        if self.delay:
            time.sleep(self.delay)

    def _list(self, request: bytes, context: Any) -> bytes:
        self._count("List")
        return wire.encode_list_response(self._pods(context))

    def _get(self, request: bytes, context: Any) -> bytes:
        import grpc

        self._count("Get")
        if self.get == "disabled":
            context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        try:
            namespace, name = wire.decode_get_request(request)
        except wire.WireFormatError as e:
            context.abort(grpc.StatusCode.INTERNAL, f"grpc: error unmarshalling request: {e}")
            raise
        for pod in self._pods(context):
            if (pod.namespace, pod.name) == (namespace, name):
                return wire.encode_get_response(pod)
        context.abort(grpc.StatusCode.UNKNOWN, f"pod {name} in namespace {namespace} not found")
        raise AssertionError("unreachable")


def start(socket_path: str | os.PathLike[str], pods_file: str | os.PathLike[str], *,
          get: str = "enabled", delay: float = 0.0) -> SimulatedKubelet:
    """A simulated kubelet pod-resources server, listening when this returns."""
    return SimulatedKubelet(socket_path, pods_file, get=get, delay=delay).start()


def spawn(socket_path: str | os.PathLike[str], pods_file: str | os.PathLike[str], *,
          get: str = "enabled", timeout: float = 10.0) -> subprocess.Popen[str]:
    """`python -m tenantnet.lab.podresources` in the background, returned once it listens.
    Stop it with `terminate(proc)`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tenantnet.lab.podresources",
         "--socket", os.path.abspath(socket_path), "--pods", os.path.abspath(pods_file), "--get", get],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        line = proc.stdout.readline()
    finally:
        timer.cancel()
    if not line.startswith("ready "):
        proc.kill()
        _, err = proc.communicate()
        raise RuntimeError(f"simulated kubelet did not start on {socket_path}: {err.strip() or line}")
    return proc


def terminate(proc: subprocess.Popen[str], timeout: float = 5.0) -> int:
    """Stop a `spawn`ed server (SIGTERM, then SIGKILL after `timeout`); its exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    return proc.returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tenantnet.lab.podresources",
        description="A SIMULATED kubelet pod-resources server (v1.PodResourcesLister List/Get) "
                    "for the lab, answering from a JSON pods file.")
    parser.add_argument("--socket", required=True, help="unix socket to listen on")
    parser.add_argument("--pods", required=True, help="JSON pods file (re-read when it changes)")
    parser.add_argument("--get", choices=GET_MODES, default="enabled",
                        help="the kubelet's Get: enabled, disabled (gate off) or absent (< 1.27)")
    parser.add_argument("--delay", type=float, default=0.0, help="hold every answer back (seconds)")
    args = parser.parse_args(argv)
    # Blocked before gRPC starts its threads (they inherit the mask) and taken with sigwait:
    # no handler that could run in the middle of anything.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    server = SimulatedKubelet(args.socket, args.pods, get=args.get, delay=args.delay)
    try:
        server.start()
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"ready {server.socket_path}", flush=True)
    try:
        signal.sigwait(stop_signals)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
