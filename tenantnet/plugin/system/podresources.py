"""The kubelet pod-resources API: which devices (GPUs) a pod was given, and their PCI addresses.

This module owns three things:

1. **The wire format** of the few `k8s.io/kubelet/pkg/apis/podresources/v1` messages we use,
   encoded and decoded by hand (protobuf wire format: varints and length-delimited fields), so
   neither generated code nor the `protobuf` package is needed. Field numbers, from
   `staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto` (kubernetes/kubernetes):

   ```
   ListPodResourcesRequest  {}
   ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
   GetPodResourcesRequest   { string pod_name = 1; string pod_namespace = 2; }
   GetPodResourcesResponse  { PodResources pod_resources = 1; }
   PodResources             { string name = 1; string namespace = 2;
                              repeated ContainerResources containers = 3; }
   ContainerResources       { string name = 1; repeated ContainerDevices devices = 2;
                              repeated int64 cpu_ids = 3; repeated ContainerMemory memory = 4;
                              repeated DynamicResource dynamic_resources = 5; }
   ContainerDevices         { string resource_name = 1; repeated string device_ids = 2;
                              TopologyInfo topology = 3; }
   TopologyInfo             { repeated NUMANode nodes = 1; }
   NUMANode                 { int64 ID = 1; }
   ```

   The decoder reads only those fields; every other field (cpu_ids, memory,
   dynamic_resources, anything a later kubelet adds) is skipped whatever its wire type,
   groups included, and a known field arriving with another wire type is skipped like an
   unknown one (as the protobuf runtimes do). It is bounded against a broken or hostile
   server: at most `Limits.max_bytes` of input, at most `Limits.max_pods` pods and
   `Limits.max_items` decoded elements (pods, containers, device groups, device ids, NUMA
   nodes), group nesting at most `Limits.max_group_depth` deep; the schema itself is six
   levels deep and unknown length-delimited fields are skipped, not parsed, so nothing else
   recurses; and, given a `deadline`, the decoder looks at the clock every
   `DEADLINE_EVERY` elements, so the client's timeout bounds decoding too. Every problem is
   a `WireFormatError` that says what and at which byte — never another exception
   (`AnswerTooLarge` and `DecodeDeadline` are its kinds for the two bounds).
   tests/unit/test_podresources.py holds the codec to stubs that grpcio-tools generates
   from the upstream api.proto at test time.

2. **The client**, `PodResourcesClient`: gRPC over the kubelet's unix socket
   (`/var/lib/kubelet/pod-resources/kubelet.sock`), `v1.PodResourcesLister/Get` where the
   kubelet has it, else `List`. Get exists since Kubernetes 1.27 behind the feature gate
   `KubeletPodResourcesGet` (alpha, off, in 1.27–1.33; beta, on, from 1.34). A kubelet
   older than 1.27 answers Get with UNIMPLEMENTED; one with the gate off answers UNKNOWN
   "PodResources API Get method disabled"; both make the client use List from then on (it
   tries Get again after `GET_REPROBE_SECONDS`). Get for a pod the kubelet does not know
   answers UNKNOWN "pod … not found"; then List decides, so a wrong guess costs one call,
   never a wrong answer. `grpc` is imported on first use, never at module import (≈ 80–120 ms
   here). A pod's devices do not change during its life, so answers are cached per pod for
   `cache_ttl` seconds; a pod the kubelet does not list is never cached (it may appear a
   moment later), and `forget()` drops a pod at DEL, so a pod recreated under the same name
   (a StatefulSet) is asked about afresh. The pod-resources API carries no pod UID; the TTL
   bounds how long a recreated namesake could be answered from the cache without `forget()`.

3. **GPU device id → PCI address**, `gpu_pci_addresses()`. The pod-resources answer names a
   GPU by the device plugin's id, not by PCI address. With the NVIDIA device plugin that id is
   the GPU UUID `GPU-<uuid>` (default `deviceIDStrategy: uuid`); `GPU-<uuid>::<n>` for a
   time-sliced replica (the plugin's "annotated id"); a MIG device's UUID `MIG-<uuid>` (older
   drivers: `MIG-GPU-<uuid>/<gi>/<ci>`); or a bare index `0`, `1`, … with
   `deviceIDStrategy: index`. How a caller gets from there to a PCI address:

   - **the nvidia driver's /proc** (`NvidiaProcfs`, implemented): every GPU the `nvidia`
     kernel module drives has `/proc/driver/nvidia/gpus/<domain:bus:dev.fn>/information`,
     whose `GPU UUID:` line carries the UUID — the directory name is the PCI address. Read
     under a configurable root (tests and the lab use a fake tree). A GPU not yet initialised
     may show its UUID as question marks; run `nvidia-persistenced` or map it explicitly.
   - **the node config** (an explicit `{device id or GPU UUID: PCI address}` mapping,
     implemented): for MIG UUIDs, index ids, or hosts whose /proc is not visible to the agent.
   - *not used:* `PASS_DEVICE_SPECS` / CDI hand the container device nodes (`/dev/nvidiaN`),
     not PCI addresses (N is the `Device Minor:` line of the same /proc file); NVML
     (`nvidia-smi --query-gpu=uuid,pci.bus_id`) needs NVIDIA's library in the agent.

   Time-slice suffixes are dropped and a legacy MIG id maps to its parent GPU; a modern
   `MIG-<uuid>` or an index needs the explicit mapping. Anything unmapped is a
   `GpuMappingError` naming every such id and the source that was asked.
"""

from __future__ import annotations

import importlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tenantnet.plugin.pci import normalise_pci_address

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_GPU_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu",)
SERVICE = "v1.PodResourcesLister"
LIST_METHOD = f"/{SERVICE}/List"
GET_METHOD = f"/{SERVICE}/Get"
# After the kubelet said it has no Get, how long before asking it again (it may be restarted
# with the feature gate on); List serves meanwhile.
GET_REPROBE_SECONDS = 600.0

# Protobuf wire types.
VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
_MAX_FIELD = (1 << 29) - 1
_U64 = (1 << 64) - 1


# -- errors ---------------------------------------------------------------------------------


class WireFormatError(ValueError):
    """Bytes that are not a valid message of the expected type; the message says why and where."""


class AnswerTooLarge(WireFormatError):
    """An answer over one of the `Limits` (bytes, pods, elements): refused, not decoded on."""


class DecodeDeadline(WireFormatError):
    """Decoding was still going when the caller's deadline passed."""


class PodResourcesError(Exception):
    """The kubelet's pod-resources API could not answer; the message names the socket and why."""

    def __init__(self, message: str, socket_path: str = "") -> None:
        super().__init__(message)
        self.socket_path = socket_path


class PodResourcesUnavailable(PodResourcesError):
    """Nothing usable on the socket: missing, not a socket, permission denied, nobody listening."""


class PodResourcesTimeout(PodResourcesError):
    """The kubelet did not answer within the client's timeout."""


class PodNotFound(PodResourcesError):
    """The kubelet does not list the pod (not admitted on this node, or already gone)."""


class GpuMappingError(Exception):
    """A GPU device id could not be mapped to a PCI address; the message names the ids and source."""


# -- the messages ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerDevices:
    """One `ContainerDevices`: devices of one resource given to a container, with their NUMA nodes."""

    resource_name: str
    device_ids: tuple[str, ...] = ()
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class ContainerResources:
    """One `ContainerResources` (only its name and devices; CPUs, memory and DRA are skipped)."""

    name: str
    devices: tuple[ContainerDevices, ...] = ()


@dataclass(frozen=True)
class PodResources:
    """One `PodResources`: a pod and what its containers were given."""

    namespace: str
    name: str
    containers: tuple[ContainerResources, ...] = ()


@dataclass(frozen=True)
class GpuGrant:
    """One GPU device of a pod: the container holding it, the resource, the device plugin's id,
    and the NUMA nodes the kubelet reports for it (empty when the device plugin reports none)."""

    container: str
    resource: str
    device_id: str
    numa_nodes: tuple[int, ...]


@dataclass(frozen=True)
class Limits:
    """Bounds on decoding one answer. The kubelet's own defaults are far inside them: a node
    runs at most a few hundred pods, each with a handful of devices."""

    max_bytes: int = 16 * 1024 * 1024
    max_items: int = 500_000
    max_group_depth: int = 32
    # The kubelet's --max-pods defaults to 110 and is rarely set past a few hundred; 200,000
    # pods took 3 s to decode here. 10,000 decode in ≈ 0.15 s.
    max_pods: int = 10_000


DEFAULT_LIMITS = Limits()


# -- encoding -------------------------------------------------------------------------------


def encode_varint(value: int) -> bytes:
    """Unsigned varint; a negative value is taken as int64 two's complement (10 bytes)."""
    if value < 0:
        value &= _U64
    if value > _U64:
        raise ValueError(f"{value} does not fit in 64 bits")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field_number: int, wire_type: int) -> bytes:
    return encode_varint((field_number << 3) | wire_type)


def _len_field(field_number: int, payload: bytes) -> bytes:
    return _key(field_number, LEN) + encode_varint(len(payload)) + payload


def _str_field(field_number: int, text: str, *, repeated: bool = False) -> bytes:
    # proto3 leaves a singular field at its default (empty) out; repeated elements always count.
    if not text and not repeated:
        return b""
    return _len_field(field_number, text.encode("utf-8"))


def encode_list_request() -> bytes:
    """`ListPodResourcesRequest {}`: no fields, zero bytes."""
    return b""


def encode_get_request(namespace: str, name: str) -> bytes:
    """`GetPodResourcesRequest {pod_name = 1, pod_namespace = 2}`."""
    return _str_field(1, name) + _str_field(2, namespace)


def encode_container_devices(dev: ContainerDevices) -> bytes:
    out = _str_field(1, dev.resource_name)
    for device_id in dev.device_ids:
        out += _str_field(2, device_id, repeated=True)
    if dev.numa_nodes:
        # TopologyInfo {repeated NUMANode nodes = 1}; NUMANode {int64 ID = 1}, ID 0 left out.
        topology = b"".join(
            _len_field(1, _key(1, VARINT) + encode_varint(n) if n else b"") for n in dev.numa_nodes
        )
        out += _len_field(3, topology)
    return out


def encode_container(container: ContainerResources) -> bytes:
    out = _str_field(1, container.name)
    for dev in container.devices:
        out += _len_field(2, encode_container_devices(dev))
    return out


def encode_pod(pod: PodResources) -> bytes:
    out = _str_field(1, pod.name) + _str_field(2, pod.namespace)
    for container in pod.containers:
        out += _len_field(3, encode_container(container))
    return out


def encode_list_response(pods: Iterable[PodResources]) -> bytes:
    return b"".join(_len_field(1, encode_pod(p)) for p in pods)


def encode_get_response(pod: PodResources) -> bytes:
    return _len_field(1, encode_pod(pod))


# -- decoding -------------------------------------------------------------------------------


# How many decoded elements between two looks at the clock (a look costs ≈ 50 ns, an element
# ≈ 10 µs: the deadline is overrun by well under a millisecond).
DEADLINE_EVERY = 64


class _Budget:
    """Counts decoded elements against `Limits.max_items` (and pods against `max_pods`), and
    looks at the clock every `DEADLINE_EVERY` of them when there is a deadline."""

    __slots__ = ("left", "limit", "pods_left", "pod_limit", "deadline", "clock", "taken")

    def __init__(self, limits: Limits, deadline: float | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.left = self.limit = limits.max_items
        self.pods_left = self.pod_limit = limits.max_pods
        self.deadline = deadline
        self.clock = clock or time.monotonic
        self.taken = 0

    def take(self, what: str) -> None:
        self.left -= 1
        self.taken += 1
        if self.left < 0:
            raise AnswerTooLarge(f"more than {self.limit} elements (at a {what}): refused")
        if what == "pod":
            self.pods_left -= 1
            if self.pods_left < 0:
                raise AnswerTooLarge(f"more than {self.pod_limit} pods: refused (Limits.max_pods)")
        if self.deadline is not None and self.taken % DEADLINE_EVERY == 0 and self.clock() >= self.deadline:
            raise DecodeDeadline(f"decoding not done by the deadline ({self.taken} elements decoded)")


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    start = pos
    while True:
        if pos >= end:
            raise WireFormatError(f"truncated varint at byte {start}")
        b = buf[pos]
        pos += 1
        if shift == 63 and b > 1:
            raise WireFormatError(f"varint at byte {start} longer than 64 bits")
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _skip_group(buf: memoryview, pos: int, end: int, field_number: int, limits: Limits) -> int:
    """Skip a (deprecated) group whose start tag was just read; nested groups iteratively."""
    open_groups = [field_number]
    while open_groups:
        if pos >= end:
            raise WireFormatError(f"group {open_groups[-1]} not closed before byte {end}")
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0 or number > _MAX_FIELD:
            raise WireFormatError(f"invalid field number {number} at byte {pos}")
        if wire == SGROUP:
            if len(open_groups) >= limits.max_group_depth:
                raise WireFormatError(f"groups nested deeper than {limits.max_group_depth}")
            open_groups.append(number)
        elif wire == EGROUP:
            if open_groups[-1] != number:
                raise WireFormatError(f"end of group {number} inside group {open_groups[-1]}")
            open_groups.pop()
        else:
            pos = _skip_value(buf, pos, end, wire)
    return pos


def _skip_value(buf: memoryview, pos: int, end: int, wire: int) -> int:
    if wire == VARINT:
        return _varint(buf, pos, end)[1]
    if wire == I64:
        size = 8
    elif wire == I32:
        size = 4
    elif wire == LEN:
        size, pos = _varint(buf, pos, end)
    else:
        raise WireFormatError(f"invalid wire type {wire} at byte {pos}")
    if size > end - pos:
        raise WireFormatError(f"field at byte {pos} runs {size - (end - pos)} bytes past its end")
    return pos + size


def _fields(buf: memoryview, pos: int, end: int, limits: Limits) -> Iterator[tuple[int, int, int, int]]:
    """Each field of one message as (number, wire type, value, end): for VARINT the value is the
    number; for LEN `buf[value:end]` is the payload. Groups and fixed-width fields are skipped."""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0 or number > _MAX_FIELD:
            raise WireFormatError(f"invalid field number {number} at byte {pos}")
        if wire == VARINT:
            value, pos = _varint(buf, pos, end)
            yield number, wire, value, pos
        elif wire == LEN:
            size, pos = _varint(buf, pos, end)
            if size > end - pos:
                raise WireFormatError(
                    f"field {number} at byte {pos} is {size} bytes long, only {end - pos} left"
                )
            yield number, wire, pos, pos + size
            pos += size
        elif wire == SGROUP:
            pos = _skip_group(buf, pos, end, number, limits)
        elif wire == EGROUP:
            raise WireFormatError(f"end of group {number} at byte {pos} without a start")
        else:
            pos = _skip_value(buf, pos, end, wire)


def _text(buf: memoryview, start: int, end: int, what: str) -> str:
    try:
        return bytes(buf[start:end]).decode("utf-8")
    except UnicodeDecodeError as e:
        raise WireFormatError(f"{what} at byte {start} is not UTF-8: {e.reason}") from None


def _numa_node(buf: memoryview, start: int, end: int, limits: Limits) -> int:
    node = 0
    for number, wire, value, _ in _fields(buf, start, end, limits):
        if number == 1 and wire == VARINT:
            node = value - (1 << 64) if value >= 1 << 63 else value  # int64
    return node


def _container_devices(buf: memoryview, start: int, end: int, limits: Limits,
                       budget: _Budget) -> ContainerDevices:
    resource = ""
    ids: list[str] = []
    nodes: list[int] = []
    for number, wire, a, b in _fields(buf, start, end, limits):
        if wire != LEN:
            continue
        if number == 1:
            resource = _text(buf, a, b, "resource_name")
        elif number == 2:
            budget.take("device id")
            ids.append(_text(buf, a, b, "device id"))
        elif number == 3:
            # TopologyInfo; a repeated occurrence merges (its nodes append).
            for n_number, n_wire, na, nb in _fields(buf, a, b, limits):
                if n_number == 1 and n_wire == LEN:
                    budget.take("NUMA node")
                    nodes.append(_numa_node(buf, na, nb, limits))
    return ContainerDevices(resource, tuple(ids), tuple(nodes))


def _container(buf: memoryview, start: int, end: int, limits: Limits,
               budget: _Budget) -> ContainerResources:
    name = ""
    devices: list[ContainerDevices] = []
    for number, wire, a, b in _fields(buf, start, end, limits):
        if wire != LEN:
            continue
        if number == 1:
            name = _text(buf, a, b, "container name")
        elif number == 2:
            budget.take("device group")
            devices.append(_container_devices(buf, a, b, limits, budget))
    return ContainerResources(name, tuple(devices))


def _pod(buf: memoryview, start: int, end: int, limits: Limits, budget: _Budget,
         want: tuple[str, str] | None) -> PodResources | None:
    """The pod at buf[start:end]; None if `want` (namespace, name) is given and it is another pod
    (then its containers are not decoded at all)."""
    name = namespace = ""
    chunks: list[tuple[int, int]] = []
    for number, wire, a, b in _fields(buf, start, end, limits):
        if wire != LEN:
            continue
        if number == 1:
            name = _text(buf, a, b, "pod name")
        elif number == 2:
            namespace = _text(buf, a, b, "pod namespace")
        elif number == 3:
            chunks.append((a, b))
    if want is not None and want != (namespace, name):
        return None
    containers = []
    for a, b in chunks:
        budget.take("container")
        containers.append(_container(buf, a, b, limits, budget))
    return PodResources(namespace, name, tuple(containers))


def _view(data: bytes | bytearray | memoryview, limits: Limits, what: str) -> memoryview:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireFormatError(f"a {what} is bytes, not {type(data).__name__}")
    try:
        buf = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    except TypeError as e:  # a non-contiguous view
        raise WireFormatError(f"a {what} must be contiguous bytes: {e}") from None
    if len(buf) > limits.max_bytes:
        raise AnswerTooLarge(f"a {what} of {len(buf)} bytes is over the limit of {limits.max_bytes}")
    return buf


def decode_list_response(data: bytes | bytearray | memoryview, *, limits: Limits = DEFAULT_LIMITS,
                         namespace: str | None = None, name: str | None = None,
                         deadline: float | None = None,
                         clock: Callable[[], float] | None = None) -> list[PodResources]:
    """The pods of a `ListPodResourcesResponse`; with `namespace` and `name`, only that pod's
    entries (other pods are checked for well-formedness up to their names, not decoded).
    `deadline` (on `clock`, default time.monotonic): DecodeDeadline if decoding is not done
    by then."""
    buf = _view(data, limits, "ListPodResourcesResponse")
    want = None if namespace is None and name is None else (namespace or "", name or "")
    budget = _Budget(limits, deadline, clock)
    pods = []
    for number, wire, a, b in _fields(buf, 0, len(buf), limits):
        if number == 1 and wire == LEN:
            budget.take("pod")
            pod = _pod(buf, a, b, limits, budget, want)
            if pod is not None:
                pods.append(pod)
    return pods


def decode_get_response(data: bytes | bytearray | memoryview, *, limits: Limits = DEFAULT_LIMITS,
                        deadline: float | None = None,
                        clock: Callable[[], float] | None = None) -> PodResources | None:
    """The pod of a `GetPodResourcesResponse`, None if the field is absent. Repeated occurrences
    of the singular field merge, as protobuf says: their payloads are read as one message."""
    buf = _view(data, limits, "GetPodResourcesResponse")
    chunks = [bytes(buf[a:b]) for number, wire, a, b in _fields(buf, 0, len(buf), limits)
              if number == 1 and wire == LEN]
    if not chunks:
        return None
    merged = memoryview(b"".join(chunks)) if len(chunks) > 1 else memoryview(chunks[0])
    return _pod(merged, 0, len(merged), limits, _Budget(limits, deadline, clock), None)


def decode_get_request(data: bytes | bytearray | memoryview, *,
                       limits: Limits = DEFAULT_LIMITS) -> tuple[str, str]:
    """(namespace, name) of a `GetPodResourcesRequest` (for servers: the lab's simulation)."""
    buf = _view(data, limits, "GetPodResourcesRequest")
    name = namespace = ""
    for number, wire, a, b in _fields(buf, 0, len(buf), limits):
        if wire == LEN and number == 1:
            name = _text(buf, a, b, "pod_name")
        elif wire == LEN and number == 2:
            namespace = _text(buf, a, b, "pod_namespace")
    return namespace, name


def gpu_grants(pod: PodResources, resource_names: Iterable[str] = DEFAULT_GPU_RESOURCES) -> list[GpuGrant]:
    """One grant per device id of the named resources, in the kubelet's order."""
    wanted = frozenset(resource_names)
    return [GpuGrant(c.name, d.resource_name, device_id, d.numa_nodes)
            for c in pod.containers for d in c.devices if d.resource_name in wanted
            for device_id in d.device_ids]


# -- the client -----------------------------------------------------------------------------


_T = TypeVar("_T")


def _grpc(socket_path: str = "") -> Any:
    # Imported here, not at module level: grpc costs ≈ 100 ms, and only the agent asks.
    try:
        return importlib.import_module("grpc")
    except ImportError as e:
        raise PodResourcesError(f"kubelet pod-resources socket {socket_path}: the grpcio package "
                                f"is not installed ({e})", socket_path) from None


class _RpcFailure(Exception):
    """An answer with a gRPC status other than OK (the kubelet's own error)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


class PodResourcesClient:
    """A client of the kubelet's pod-resources socket, with a per-pod cache (thread-safe).

    `timeout` bounds one whole `gpus_of`/`pod`/`list_pods` call: a Get and the List after it
    and the decoding of their answers included; `clock` is for the cache only (tests pass a
    fake one).
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 2.0, *,
                 cache_ttl: float = 10.0, cache_size: int = 256, limits: Limits = DEFAULT_LIMITS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(timeout, int | float) or not 0 < timeout < math.inf:
            raise ValueError(f"pod-resources timeout {timeout!r}: a number of seconds > 0")
        if not isinstance(socket_path, str) or not socket_path:
            raise ValueError(f"pod-resources socket {socket_path!r}: a path")
        if len(os.fsencode(os.path.abspath(socket_path))) > 107:
            raise ValueError(f"pod-resources socket {socket_path}: longer than a unix socket "
                             "path may be (107 bytes)")
        self.socket_path = socket_path
        self.timeout = float(timeout)
        self.cache_ttl = cache_ttl
        self.cache_size = max(1, cache_size)
        self.limits = limits
        self.clock = clock
        # (namespace, name) → (pod, expiry on `clock`)
        self._cache: dict[tuple[str, str], tuple[PodResources, float]] = {}
        self._lock = threading.Lock()
        self._channel: Any = None
        self._stubs: dict[str, Any] = {}
        self._get_off_until = -math.inf

    def __repr__(self) -> str:
        return f"PodResourcesClient({self.socket_path!r}, timeout={self.timeout:g})"

    # -- public API -------------------------------------------------------------------------

    def gpus_of(self, namespace: str, name: str,
                resource_names: Sequence[str] = DEFAULT_GPU_RESOURCES) -> list[GpuGrant]:
        """The pod's devices of `resource_names` (GPUs by default), one grant per device id.
        PodNotFound if the kubelet does not list the pod; other PodResourcesErrors as `pod`."""
        return gpu_grants(self.pod(namespace, name), resource_names)

    def pod(self, namespace: str, name: str) -> PodResources:
        """What the kubelet gave the pod, from the cache while fresh, else from the kubelet."""
        key = (namespace, name)
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[1] > now:
                return hit[0]
        pod = self._fetch(namespace, name, time.monotonic() + self.timeout)
        with self._lock:
            if len(self._cache) >= self.cache_size and key not in self._cache:
                self._evict(now)
            self._cache[key] = (pod, self.clock() + self.cache_ttl)
        return pod

    def list_pods(self) -> list[PodResources]:
        """Every pod the kubelet lists (uncached)."""
        deadline = time.monotonic() + self.timeout
        try:
            data = self._call("List", encode_list_request(), deadline)
        except _RpcFailure as failure:
            raise self._error(failure, "List") from None
        return self._decode(decode_list_response, data, "List", deadline)

    def forget(self, namespace: str, name: str) -> None:
        """Drop the pod from the cache (at DEL: a namesake may follow)."""
        with self._lock:
            self._cache.pop((namespace, name), None)

    def close(self) -> None:
        with self._lock:
            channel, self._channel = self._channel, None
            self._stubs.clear()
        if channel is not None:
            channel.close()

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------

    def _evict(self, now: float) -> None:
        for k in [k for k, (_, expires) in self._cache.items() if expires <= now]:
            del self._cache[k]
        while len(self._cache) >= self.cache_size:
            del self._cache[min(self._cache, key=lambda k: self._cache[k][1])]

    def _fetch(self, namespace: str, name: str, deadline: float) -> PodResources:
        if self.clock() >= self._get_off_until:
            try:
                data = self._call("Get", encode_get_request(namespace, name), deadline)
            except _RpcFailure as failure:
                if failure.code == "UNIMPLEMENTED" or (
                        failure.code == "UNKNOWN" and "disabled" in failure.details.lower()):
                    self._get_off_until = self.clock() + GET_REPROBE_SECONDS
                elif failure.code != "UNKNOWN":
                    raise self._error(failure, "Get") from None
                # UNKNOWN otherwise is how the kubelet says "pod not found": List decides.
            else:
                pod = self._decode(decode_get_response, data, "Get", deadline)
                if pod is not None:
                    if (pod.namespace, pod.name) != (namespace, name):
                        raise PodResourcesError(
                            f"kubelet pod-resources socket {self.socket_path}: Get for pod "
                            f"{namespace}/{name} answered pod {pod.namespace}/{pod.name}",
                            self.socket_path)
                    return pod
        try:
            data = self._call("List", encode_list_request(), deadline)
        except _RpcFailure as failure:
            raise self._error(failure, "List") from None
        pods = self._decode(decode_list_response, data, "List", deadline, namespace=namespace, name=name)
        if not pods:
            raise PodNotFound(f"kubelet pod-resources socket {self.socket_path}: no pod "
                              f"{namespace}/{name} on this node", self.socket_path)
        if len(pods) > 1:
            raise PodResourcesError(f"kubelet pod-resources socket {self.socket_path}: pod "
                                    f"{namespace}/{name} listed {len(pods)} times", self.socket_path)
        return pods[0]

    def _decode(self, decoder: Callable[..., _T], data: bytes, method: str, deadline: float,
                **kw: Any) -> _T:
        try:
            return decoder(data, limits=self.limits, deadline=deadline, **kw)
        except DecodeDeadline as e:
            raise PodResourcesTimeout(
                f"kubelet pod-resources socket {self.socket_path}: the answer to {method} "
                f"({len(data)} bytes) was not decoded within {self.timeout:g} s: {e}",
                self.socket_path) from e
        except AnswerTooLarge as e:
            raise PodResourcesError(f"kubelet pod-resources socket {self.socket_path}: the answer "
                                    f"to {method} is over the limit: {e}", self.socket_path) from e
        except WireFormatError as e:
            raise PodResourcesError(f"kubelet pod-resources socket {self.socket_path}: the answer "
                                    f"to {method} is malformed: {e}", self.socket_path) from e

    def _stub(self, method: str) -> Any:
        with self._lock:
            if self._channel is None:
                grpc = _grpc(self.socket_path)
                self._channel = grpc.insecure_channel(
                    "unix:" + os.path.abspath(self.socket_path),
                    options=[
                        ("grpc.max_receive_message_length", self.limits.max_bytes),
                        ("grpc.max_send_message_length", 64 * 1024),
                        ("grpc.enable_http_proxy", 0),
                        # A restarted kubelet is reconnected to within a second, not grpc's
                        # default backoff of up to two minutes.
                        ("grpc.initial_reconnect_backoff_ms", 100),
                        ("grpc.max_reconnect_backoff_ms", 1000),
                    ],
                )
            stub = self._stubs.get(method)
            if stub is None:
                path = LIST_METHOD if method == "List" else GET_METHOD
                stub = self._stubs[method] = self._channel.unary_unary(path)
            return stub

    def _drop_channel(self) -> None:
        """A fresh channel for the next call instead of waiting out grpc's reconnect backoff.
        The old one is not closed here (that would cancel other threads' calls on it): grpc
        closes a channel when it is collected."""
        with self._lock:
            self._channel = None
            self._stubs.clear()

    def _call(self, method: str, request: bytes, deadline: float) -> bytes:
        """One unary call; `_RpcFailure` for an answer with a gRPC status, PodResourcesError
        subclasses for a missing socket, no connection and a timeout."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise self._timeout(method)
        stub = self._stub(method)
        grpc = _grpc(self.socket_path)
        try:
            answer = stub(request, timeout=remaining)
        except grpc.RpcError as e:
            code = e.code() if callable(getattr(e, "code", None)) else None
            code_name = getattr(code, "name", "UNKNOWN")
            details = (e.details() if callable(getattr(e, "details", None)) else None) or ""
            if code_name == "DEADLINE_EXCEEDED":
                raise self._timeout(method) from None
            if code_name == "UNAVAILABLE":
                self._drop_channel()
                cause = diagnose_socket(self.socket_path) or f"gRPC UNAVAILABLE: {details}"
                raise PodResourcesUnavailable(
                    f"kubelet pod-resources socket {self.socket_path}: {cause}", self.socket_path
                ) from None
            raise _RpcFailure(code_name, details) from None
        if not isinstance(answer, bytes):
            raise PodResourcesError(f"kubelet pod-resources socket {self.socket_path}: {method} "
                                    f"gave {type(answer).__name__}, not bytes", self.socket_path)
        return answer

    def _timeout(self, method: str) -> PodResourcesTimeout:
        return PodResourcesTimeout(
            f"kubelet pod-resources socket {self.socket_path}: no answer to {method} within "
            f"{self.timeout:g} s (kubelet stalled or overloaded)", self.socket_path)

    def _error(self, failure: _RpcFailure, method: str) -> PodResourcesError:
        hint = ""
        if failure.code == "RESOURCE_EXHAUSTED":
            hint = " (the kubelet rate-limits this API, or the answer is over the size limit)"
        return PodResourcesError(
            f"kubelet pod-resources socket {self.socket_path}: {method} failed with "
            f"{failure.code}: {failure.details}{hint}", self.socket_path)


def diagnose_socket(path: str) -> str | None:
    """Why nothing answers on the unix socket `path`, or None if a connect succeeds."""
    import errno
    import socket
    import stat
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return ("no such socket (kubelet not running, or /var/lib/kubelet/pod-resources not "
                "mounted into this container)")
    except PermissionError:
        return "permission denied on a directory above the socket"
    except OSError as e:
        return f"cannot stat the socket: {e.strerror}"
    if not stat.S_ISSOCK(st.st_mode):
        return "exists but is not a socket"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(0.5)
    try:
        sock.connect(path)
    except PermissionError:
        return "permission denied (the kubelet's socket is root's: run as root)"
    except ConnectionRefusedError:
        return "connection refused: nobody listens (a stale socket: kubelet down or restarting)"
    except OSError as e:
        return f"cannot connect: {e.strerror or errno.errorcode.get(e.errno or 0, str(e))}"
    finally:
        sock.close()
    return None


# -- GPU device id → PCI address --------------------------------------------------------------


_INFO_LIMIT = 64 * 1024


@dataclass(frozen=True)
class NvidiaProcfs:
    """GPU UUIDs from the nvidia driver's `<root>/driver/nvidia/gpus/<pci>/information` files."""

    root: str = "/proc"

    @property
    def gpus_dir(self) -> str:
        return os.path.join(self.root, "driver", "nvidia", "gpus")

    def uuids(self) -> tuple[dict[str, str], list[str]]:
        """({GPU UUID (casefolded): PCI address}, [PCI addresses whose UUID is not readable])."""
        try:
            entries = sorted(os.listdir(self.gpus_dir))
        except FileNotFoundError:
            raise GpuMappingError(f"no {self.gpus_dir}: the nvidia kernel driver is not loaded "
                                  "(or this is not the host's /proc)") from None
        except OSError as e:
            raise GpuMappingError(f"cannot read {self.gpus_dir}: {e.strerror}") from None
        found: dict[str, str] = {}
        unreadable: list[str] = []
        for entry in entries:
            address = normalise_pci_address(entry)
            if address is None:
                continue
            uuid = self._uuid(os.path.join(self.gpus_dir, entry, "information"))
            if uuid is None:
                unreadable.append(address)
            else:
                found[uuid.casefold()] = address
        return found, unreadable

    @staticmethod
    def _uuid(path: str) -> str | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            text = os.read(fd, _INFO_LIMIT).decode("utf-8", "replace")
        except OSError:
            return None
        finally:
            os.close(fd)
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "GPU UUID":
                uuid = value.strip()
                return uuid if uuid.startswith("GPU-") and "?" not in uuid else None
        return None


MappingSource = NvidiaProcfs | Mapping[str, str]


def _gpu_uuid_of(device_id: str) -> str:
    """The physical GPU's UUID a device plugin id stands for, as far as the id itself says:
    `GPU-x::3` (a time-slice replica) → `GPU-x`; `MIG-GPU-x/1/0` (legacy MIG) → `GPU-x`."""
    base = device_id.split("::", 1)[0]
    if base.startswith("MIG-GPU-"):
        return base[len("MIG-"):].split("/", 1)[0]
    return base


def gpu_pci_addresses(device_ids: Iterable[str], mapping_source: MappingSource) -> dict[str, str]:
    """{device id: PCI address} for every id, in order; GpuMappingError names all it cannot map.

    `mapping_source`: an `NvidiaProcfs`, or an explicit mapping whose keys are device ids or
    GPU UUIDs (looked up as given, then without a time-slice suffix, then as the parent GPU).
    """
    ids = list(device_ids)
    result: dict[str, str] = {}
    missing: list[str] = []
    if isinstance(mapping_source, NvidiaProcfs):
        by_uuid, unreadable = mapping_source.uuids()
        where = f"{mapping_source.gpus_dir}/*/information"
        for device_id in ids:
            address = by_uuid.get(_gpu_uuid_of(device_id).casefold())
            if address is None:
                missing.append(device_id)
            else:
                result[device_id] = address
        if missing:
            notes = []
            if any(d.startswith("MIG-") and not d.startswith("MIG-GPU-") for d in missing):
                notes.append("a MIG UUID names no GPU there: map it in the node config")
            if any(d.isdigit() for d in missing):
                notes.append("index ids (deviceIDStrategy: index) need the node config's mapping")
            if unreadable:
                notes.append(f"GPUs with no readable UUID (not initialised? run nvidia-persistenced): "
                             f"{', '.join(unreadable)}")
            raise GpuMappingError(f"GPU device ids not found in {where}: {', '.join(missing)}"
                                  + "".join(f"; {n}" for n in notes))
        return result
    if not isinstance(mapping_source, Mapping):
        raise TypeError(f"mapping_source: NvidiaProcfs or a mapping, not {type(mapping_source).__name__}")
    folded = {str(k).casefold(): (k, v) for k, v in mapping_source.items()}
    for device_id in ids:
        entry = None
        for candidate in (device_id, device_id.split("::", 1)[0], _gpu_uuid_of(device_id)):
            entry = folded.get(candidate.casefold())
            if entry is not None:
                break
        if entry is None:
            missing.append(device_id)
            continue
        key, value = entry
        address = normalise_pci_address(value) if isinstance(value, str) else None
        if address is None:
            raise GpuMappingError(f"GPU mapping {key!r}: {value!r} is not a PCI address "
                                  "(like 0000:1b:00.0)")
        result[device_id] = address
    if missing:
        raise GpuMappingError(f"GPU device ids not in the explicit mapping: {', '.join(missing)}")
    return result
