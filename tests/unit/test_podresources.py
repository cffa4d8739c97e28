"""The kubelet pod-resources client (tenantnet.plugin.system.podresources) and the lab's
simulated kubelet (tenantnet.lab.podresources).

- Wire format, byte for byte against bytes computed by hand from api.proto's field numbers;
  unknown fields of every wire type (groups included) skipped at every level; truncated,
  oversized, over-deep, over-long and malformed input refused with WireFormatError; a
  hypothesis fuzz that the decoders raise nothing else, and encode → decode round trips.
- The client against the simulated kubelet on a socket in tmp_path: Get, Get disabled and
  Get absent (List only) with the fallback, the cache (TTL, misses not cached, forget),
  missing / not-a-socket / stale socket, a stalled server → timeout within its bound, server
  errors, malformed and oversized answers; the `python -m` runnable.
- GPU device id → PCI address on a fake /proc/driver/nvidia tree and with an explicit mapping.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenantnet.lab import podresources as lab
from tenantnet.plugin.system import podresources as pr
from tenantnet.plugin.system.podresources import (
    ContainerDevices,
    ContainerResources,
    GpuGrant,
    GpuMappingError,
    Limits,
    NvidiaProcfs,
    PodNotFound,
    PodResources,
    PodResourcesClient,
    PodResourcesError,
    PodResourcesTimeout,
    PodResourcesUnavailable,
    WireFormatError,
    decode_get_request,
    decode_get_response,
    decode_list_response,
    encode_get_request,
    encode_get_response,
    encode_list_response,
    gpu_pci_addresses,
)

# -- wire format: hand-computed bytes --------------------------------------------------------

# One pod "p" in namespace "ns", container "c" holding resource "r" devices "a", "b" on NUMA
# nodes 0 and 1. Innermost first (tag = field << 3 | wire type; 0x0a = field 1 LEN, 0x12 = 2
# LEN, 0x1a = 3 LEN, 0x08 = field 1 VARINT):
TOPOLOGY = bytes.fromhex("0a00" "0a020801")            # nodes: {ID 0} (empty), {ID 1}
DEVICES = bytes.fromhex("0a0172" "120161" "120162" "1a06") + TOPOLOGY          # 17 bytes
CONTAINER = bytes.fromhex("0a0163" "1211") + DEVICES                           # 22 bytes
POD = bytes.fromhex("0a0170" "12026e73" "1a16") + CONTAINER                    # 31 bytes
LIST_ANSWER = bytes.fromhex("0a1f") + POD                                      # 33 bytes
THE_POD = PodResources("ns", "p", (ContainerResources("c", (ContainerDevices("r", ("a", "b"), (0, 1)),)),))


def test_hand_computed_sizes_are_what_the_length_prefixes_say() -> None:
    assert (len(TOPOLOGY), len(DEVICES), len(CONTAINER), len(POD), len(LIST_ANSWER)) == (6, 17, 22, 31, 33)


def test_list_response_encodes_and_decodes_byte_for_byte() -> None:
    assert encode_list_response([THE_POD]) == LIST_ANSWER
    assert decode_list_response(LIST_ANSWER) == [THE_POD]
    assert decode_list_response(b"") == []
    assert pr.encode_list_request() == b""


def test_get_request_and_response_byte_for_byte() -> None:
    # GetPodResourcesRequest {pod_name = 1, pod_namespace = 2}
    request = b"\x0a\x07train-0\x12\x06team-a"
    assert encode_get_request("team-a", "train-0") == request
    assert decode_get_request(request) == ("team-a", "train-0")
    assert encode_get_response(THE_POD) == b"\x0a\x1f" + POD
    assert decode_get_response(b"\x0a\x1f" + POD) == THE_POD
    assert decode_get_response(b"") is None


def test_varints_and_negative_int64() -> None:
    assert pr.encode_varint(0) == b"\x00"
    assert pr.encode_varint(1) == b"\x01"
    assert pr.encode_varint(300) == b"\xac\x02"
    assert pr.encode_varint(-1) == b"\xff" * 9 + b"\x01"
    topo = b"\x0a\x0b\x08" + b"\xff" * 9 + b"\x01"   # NUMANode {ID = -1}
    devices = b"\x0a\x01r\x12\x01a\x1a" + bytes([len(topo)]) + topo
    msg = _ld(1, _ld(3, _ld(2, devices)))
    assert decode_list_response(msg)[0].containers[0].devices[0].numa_nodes == (-1,)
    assert encode_list_response(decode_list_response(msg)) == msg


def _ld(field: int, payload: bytes) -> bytes:
    """A length-delimited field (test-side helper, payloads < 128 bytes... or not)."""
    return pr.encode_varint(field << 3 | 2) + pr.encode_varint(len(payload)) + payload


# Unknown fields of each wire type: 9 VARINT, 10 I64, 11 LEN, 12 a group with a nested group
# and fields inside, 13 I32.
UNKNOWN = (bytes.fromhex("489601")                       # field 9 varint 150
           + bytes.fromhex("51") + b"\x01" * 8           # field 10 fixed64
           + bytes.fromhex("5a03") + b"xyz"              # field 11 bytes
           + bytes.fromhex("63" "0b" "0801" "0c" "1a00" "64")  # group 12 { group 1 {1: 1} 3: "" }
           + bytes.fromhex("6d") + b"\x02" * 4)          # field 13 fixed32


def test_unknown_fields_of_every_wire_type_are_skipped_at_every_level() -> None:
    numa1 = UNKNOWN + b"\x08\x01" + UNKNOWN
    topology = _ld(1, UNKNOWN) + UNKNOWN + _ld(1, numa1)
    devices = (UNKNOWN + b"\x0a\x01r" + UNKNOWN + b"\x12\x01a\x12\x01b" + _ld(3, topology)
               + b"\x08\x07")                             # field 1 as a varint: wrong type, skipped
    container = (b"\x0a\x01c" + _ld(2, devices)
                 + _ld(3, b"\x01\x02\x03")                # cpu_ids (packed)
                 + _ld(4, b"\x0a\x06memory")              # memory
                 + _ld(5, b"\x12\x05claim")               # dynamic_resources
                 + UNKNOWN)
    pod = UNKNOWN + b"\x0a\x01p\x12\x02ns" + _ld(3, container) + UNKNOWN + b"\x18\x05"
    answer = UNKNOWN + _ld(1, pod) + UNKNOWN + b"\x08\x01"   # top-level field 1 as varint: skipped
    assert decode_list_response(answer) == [THE_POD]
    assert decode_get_response(UNKNOWN + _ld(1, pod)) == THE_POD


def test_repeated_singular_message_merges() -> None:
    # GetPodResourcesResponse.pod_resources twice: protobuf merges the two messages.
    first = _ld(1, b"\x0a\x01p" + _ld(3, b"\x0a\x01c"))
    second = _ld(1, b"\x12\x02ns" + _ld(3, b"\x0a\x01d"))
    assert decode_get_response(first + second) == PodResources(
        "ns", "p", (ContainerResources("c"), ContainerResources("d")))
    # ContainerDevices.topology twice: the nodes append.
    devices = b"\x0a\x01r" + _ld(3, _ld(1, b"\x08\x01")) + _ld(3, _ld(1, b"\x08\x02"))
    pod = b"\x0a\x01p" + _ld(3, _ld(2, devices))
    assert decode_list_response(_ld(1, pod))[0].containers[0].devices[0].numa_nodes == (1, 2)


def test_every_truncation_is_refused_clearly() -> None:
    for n in range(1, len(LIST_ANSWER)):
        with pytest.raises(WireFormatError, match=r"truncated|bytes long|past its end|byte \d+"):
            decode_list_response(LIST_ANSWER[:n])


@pytest.mark.parametrize("data, message", [
    (b"\x0a\x80", r"truncated varint at byte 1"),
    (b"\x0a\x05ab", r"field 1 at byte 2 is 5 bytes long, only 2 left"),
    (b"\x08" + b"\xff" * 10 + b"\x01", r"longer than 64 bits"),
    (b"\x08" + b"\xff" * 9 + b"\x02", r"longer than 64 bits"),
    (b"\x00\x00", r"invalid field number 0"),
    (b"\x0e", r"invalid wire type 6"),
    (b"\x0f", r"invalid wire type 7"),
    (b"\x0c", r"end of group 1 at byte 1 without a start"),
    (b"\x0b\x08\x01", r"group 1 not closed"),
    (b"\x0b\x14", r"end of group 2 inside group 1"),
    (b"\x51\x01\x02", r"runs 6 bytes past its end"),
    (b"\x0a\x03\x0a\x01\xff", r"pod name at byte 4 is not UTF-8"),
    (b"\xf8\xff\xff\xff\x7f\x00", r"invalid field number"),   # field number over 2^29 - 1
])
def test_malformed_input_is_refused_with_what_and_where(data: bytes, message: str) -> None:
    with pytest.raises(WireFormatError, match=message):
        decode_list_response(data)


def test_bounds_size_items_and_group_depth() -> None:
    with pytest.raises(WireFormatError, match=r"of 33 bytes is over the limit of 32"):
        decode_list_response(LIST_ANSWER, limits=Limits(max_bytes=32))
    # pod, container, device group, 2 device ids, 2 NUMA nodes: 7 elements
    decode_list_response(LIST_ANSWER, limits=Limits(max_items=7))
    with pytest.raises(WireFormatError, match=r"more than 6 elements \(at a NUMA node\)"):
        decode_list_response(LIST_ANSWER, limits=Limits(max_items=6))
    # Many empty device ids (2 bytes each) hit the item bound long before memory does.
    devices = b"\x0a\x01r" + b"\x12\x00" * 1000
    flood = _ld(1, b"\x0a\x01p" + _ld(3, _ld(2, devices)))
    with pytest.raises(WireFormatError, match=r"more than 100 elements \(at a device id\)"):
        decode_list_response(flood, limits=Limits(max_items=100))
    deep = b"\x0b" * 33 + b"\x0c" * 33
    with pytest.raises(WireFormatError, match=r"nested deeper than 32"):
        decode_list_response(deep)
    assert decode_list_response(b"\x0b" * 32 + b"\x0c" * 32) == []
    # 100,000 nested groups: refused quickly, no RecursionError.
    with pytest.raises(WireFormatError, match=r"nested deeper"):
        decode_list_response(b"\x0b" * 100_000)


def _tiny_pods(n: int) -> list[PodResources]:
    return [PodResources("ns", f"p{i}", (ContainerResources("c", (ContainerDevices("r", ("a",), (0,)),)),))
            for i in range(n)]


def test_the_number_of_pods_is_capped() -> None:
    """Limits.max_pods: the answer is refused at the first pod over it, whatever the filter;
    the default (10,000) is far above a node's pods and far below the 200,000 that took 3 s."""
    three = encode_list_response(_tiny_pods(3))
    assert len(decode_list_response(three, limits=Limits(max_pods=3))) == 3
    for kw in ({}, {"namespace": "ns", "name": "p0"}):
        with pytest.raises(pr.AnswerTooLarge, match=r"more than 2 pods: refused \(Limits.max_pods\)"):
            decode_list_response(three, limits=Limits(max_pods=2), **kw)  # type: ignore[arg-type]
    assert Limits().max_pods == 10_000
    many = encode_list_response(_tiny_pods(10_001))
    with pytest.raises(pr.AnswerTooLarge, match=r"more than 10000 pods"):
        decode_list_response(many, namespace="ns", name="p10000")
    assert len(decode_list_response(encode_list_response(_tiny_pods(10_000)), namespace="ns", name="p0")) == 1


class CountingClock:
    """A clock that moves one second each time it is read: the number of reads is the work."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return float(self.reads)


@pytest.mark.parametrize("decode", ["list", "list-filtered", "get"])
def test_decoding_stops_at_the_deadline(decode: str) -> None:
    """The clock is read every DEADLINE_EVERY decoded elements; at the read that reaches the
    deadline, DecodeDeadline — not after the whole answer."""
    pods = _tiny_pods(2000)                   # 5 elements each: pod, container, group, id, NUMA node
    clock = CountingClock()
    with pytest.raises(pr.DecodeDeadline, match=rf"\({5 * pr.DEADLINE_EVERY} elements decoded\)"):
        if decode == "get":
            big = PodResources("ns", "p", tuple(ContainerResources(f"c{i}", (ContainerDevices("r", ("a",), (0,)),))
                                                for i in range(2000)))
            decode_get_response(encode_get_response(big), deadline=5.0, clock=clock)
        elif decode == "list":
            decode_list_response(encode_list_response(pods), deadline=5.0, clock=clock)
        else:  # only names are decoded: one element per pod
            decode_list_response(encode_list_response(pods * 3), namespace="ns", name="none",
                                 deadline=5.0, clock=clock)
    assert clock.reads == 5
    # Without a deadline the clock is never read; with a far one, the whole answer decodes.
    assert len(decode_list_response(encode_list_response(pods), clock=clock)) == 2000 and clock.reads == 5
    assert len(decode_list_response(encode_list_response(pods), deadline=1e9, clock=clock)) == 2000


def test_filtered_list_decodes_only_the_wanted_pod() -> None:
    bad_container = _ld(1, b"\x0a\x01\xff")                  # container name not UTF-8
    other = _ld(1, b"\x0a\x01q\x12\x02ns" + _ld(3, bad_container))
    answer = other + LIST_ANSWER
    assert decode_list_response(answer, namespace="ns", name="p") == [THE_POD]
    with pytest.raises(WireFormatError, match="container name"):
        decode_list_response(answer)


def test_decoders_refuse_what_is_not_bytes() -> None:
    with pytest.raises(WireFormatError, match="is bytes, not str"):
        decode_list_response("0a00")  # type: ignore[arg-type]
    assert decode_list_response(memoryview(LIST_ANSWER)) == [THE_POD]
    assert decode_list_response(bytearray(LIST_ANSWER)) == [THE_POD]


# -- wire format: fuzz ----------------------------------------------------------------------

_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_SMALL_LIMITS = Limits(max_bytes=4096, max_items=200, max_group_depth=8)


def _mutations(seed: bytes) -> st.SearchStrategy[bytes]:
    def mutate(edits: list[tuple[int, int]]) -> bytes:
        out = bytearray(seed)
        for pos, value in edits:
            if out:
                out[pos % len(out)] = value
        return bytes(out)
    return st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=4).map(mutate)


_SEED = UNKNOWN + LIST_ANSWER + _ld(1, b"\x0a\x01p" + _ld(3, _ld(2, b"\x0a\x01r\x12\x01a")))


@_FUZZ
@given(st.one_of(st.binary(max_size=300), _mutations(_SEED),
                 st.lists(st.sampled_from([b"\x0a", b"\x0b", b"\x0c", b"\x12", b"\x1a", b"\x08",
                                           b"\x80", b"\x01", b"\x05", b"\xff", b"\x00", b"\x51"]),
                          max_size=80).map(b"".join)))
def test_fuzz_decoders_raise_only_their_own_error(data: bytes) -> None:
    for decode in (decode_list_response, decode_get_response, decode_get_request):
        for limits in (pr.DEFAULT_LIMITS, _SMALL_LIMITS):
            try:
                decode(data, limits=limits)
            except WireFormatError:
                pass
    try:
        decode_list_response(data, namespace="ns", name="p")
    except WireFormatError:
        pass


_text = st.text(alphabet="ab-./é€\U0001d11e\x00", max_size=8)   # 1- to 4-byte UTF-8
_devices = st.builds(ContainerDevices, _text, st.lists(_text, max_size=3).map(tuple),
                     st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=3).map(tuple))
_containers = st.builds(ContainerResources, _text, st.lists(_devices, max_size=3).map(tuple))
_pods = st.builds(PodResources, _text, _text, st.lists(_containers, max_size=3).map(tuple))


@settings(max_examples=25, deadline=None)
@given(st.lists(_pods, max_size=4))
def test_fuzz_encode_decode_round_trip(pods: list[PodResources]) -> None:
    assert decode_list_response(encode_list_response(pods)) == pods
    for pod in pods:
        assert decode_get_response(encode_get_response(pod)) == pod
        assert decode_get_request(encode_get_request(pod.namespace, pod.name)) == (pod.namespace, pod.name)


# -- wire format: the oracle, stubs generated from the upstream api.proto -------------------

PROTO = Path(__file__).resolve().parent.parent / "fixtures" / "podresources" / "api.proto"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The `api_pb2` module grpcio-tools generates from api.proto, into a tmp dir, loaded under
    a name of its own (nothing generated is kept in the tree)."""
    import importlib.util

    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("podresources_pb2")
    status = protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={out}", str(PROTO)])
    assert status == 0, f"protoc failed on {PROTO}"
    spec = importlib.util.spec_from_file_location("tenantnet_test_podresources_api_pb2", out / "api_pb2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _to_stub(api: Any, pod: PodResources, into: Any = None) -> Any:
    msg = api.PodResources(name=pod.name, namespace=pod.namespace) if into is None else into
    if into is not None:
        msg.name, msg.namespace = pod.name, pod.namespace
    for c in pod.containers:
        container = msg.containers.add(name=c.name)
        for d in c.devices:
            devices = container.devices.add(resource_name=d.resource_name, device_ids=list(d.device_ids))
            for n in d.numa_nodes:
                devices.topology.nodes.add(ID=n)
    return msg


def _from_stub(msg: Any) -> PodResources:
    return PodResources(msg.namespace, msg.name, tuple(
        ContainerResources(c.name, tuple(
            ContainerDevices(d.resource_name, tuple(d.device_ids), tuple(n.ID for n in d.topology.nodes))
            for d in c.devices))
        for c in msg.containers))


def test_the_oracle_is_the_upstream_schema(api: Any) -> None:
    """The field numbers the module's docstring copies, as the generated descriptors have them."""
    fields = {m: {f.name: f.number for f in getattr(api, m).DESCRIPTOR.fields}
              for m in ("ListPodResourcesResponse", "GetPodResourcesRequest", "GetPodResourcesResponse",
                        "PodResources", "ContainerResources", "ContainerDevices", "TopologyInfo", "NUMANode")}
    assert fields == {
        "ListPodResourcesResponse": {"pod_resources": 1},
        "GetPodResourcesRequest": {"pod_name": 1, "pod_namespace": 2},
        "GetPodResourcesResponse": {"pod_resources": 1},
        "PodResources": {"name": 1, "namespace": 2, "containers": 3},
        "ContainerResources": {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4, "dynamic_resources": 5},
        "ContainerDevices": {"resource_name": 1, "device_ids": 2, "topology": 3},
        "TopologyInfo": {"nodes": 1},
        "NUMANode": {"ID": 1},
    }
    assert api.DESCRIPTOR.services_by_name["PodResourcesLister"].full_name == pr.SERVICE


_oracle_text = st.text(max_size=12)  # any Unicode scalar value (no surrogates: valid UTF-8)
_oracle_devices = st.builds(ContainerDevices, _oracle_text, st.lists(_oracle_text, max_size=3).map(tuple),
                            st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=3).map(tuple))
_oracle_containers = st.builds(ContainerResources, _oracle_text,
                               st.lists(_oracle_devices, max_size=3).map(tuple))
_oracle_pods = st.builds(PodResources, _oracle_text, _oracle_text,
                         st.lists(_oracle_containers, max_size=3).map(tuple))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pods=st.lists(_oracle_pods, max_size=4))
def test_codec_against_the_generated_stubs(api: Any, pods: list[PodResources]) -> None:
    """Byte for byte: the hand encoder writes what protobuf's runtime writes; each side
    decodes the other's bytes to the same pods."""
    stub = api.ListPodResourcesResponse()
    for pod in pods:
        _to_stub(api, pod, stub.pod_resources.add())
    theirs = stub.SerializeToString(deterministic=True)
    ours = encode_list_response(pods)
    assert ours == theirs
    assert decode_list_response(theirs) == pods
    parsed = api.ListPodResourcesResponse.FromString(ours)
    assert [_from_stub(p) for p in parsed.pod_resources] == pods
    for pod in pods:
        get = api.GetPodResourcesResponse(pod_resources=_to_stub(api, pod)).SerializeToString(deterministic=True)
        assert encode_get_response(pod) == get and decode_get_response(get) == pod
        request = api.GetPodResourcesRequest(pod_name=pod.name, pod_namespace=pod.namespace)
        assert encode_get_request(pod.namespace, pod.name) == request.SerializeToString(deterministic=True)
        assert decode_get_request(request.SerializeToString()) == (pod.namespace, pod.name)


def test_fields_the_codec_skips_as_the_stubs_write_them(api: Any) -> None:
    """A kubelet's full answer (CPU ids, memory, DRA claims with CDI devices, allocatable
    fields): the hand decoder reads the fields it knows and skips the rest."""
    stub = api.ListPodResourcesResponse()
    pod = stub.pod_resources.add(name="train-0", namespace="team-a")
    container = pod.containers.add(name="main", cpu_ids=[0, 1, 63, -1])
    container.memory.add(memory_type="hugepages-1Gi", size=1 << 31).topology.nodes.add(ID=1)
    claim = container.dynamic_resources.add(claim_name="gpus", claim_namespace="team-a")
    claim.claim_resources.add(driver_name="gpu.nvidia.com", pool_name="node-1", device_name="gpu-0") \
        .cdi_devices.add(name="nvidia.com/gpu=0")
    devices = container.devices.add(resource_name="nvidia.com/gpu", device_ids=["GPU-aaaa", "GPU-bbbb"])
    devices.topology.nodes.add(ID=0)
    decoded = decode_list_response(stub.SerializeToString())
    assert decoded == [PodResources("team-a", "train-0", (ContainerResources("main", (
        ContainerDevices("nvidia.com/gpu", ("GPU-aaaa", "GPU-bbbb"), (0,)),)),))]


# -- the client against the simulated kubelet ----------------------------------------------


def _gpu_pod(namespace: str = "team-a", name: str = "train-0") -> PodResources:
    return PodResources(namespace, name, (
        ContainerResources("main", (
            ContainerDevices("nvidia.com/gpu", ("GPU-aaaa", "GPU-bbbb"), (0,)),
            ContainerDevices("rdma/hca_shared", ("mlx5_0",), (0,)),
        )),
        ContainerResources("sidecar", (ContainerDevices("nvidia.com/gpu", ("GPU-cccc::1",), (1,)),)),
    ))


@pytest.fixture
def pods_file(tmp_path: Path) -> Path:
    path = tmp_path / "pods.json"
    lab.add_pod(path, _gpu_pod())
    return path


@pytest.fixture
def sock(tmp_path: Path) -> str:
    return str(tmp_path / "kubelet.sock")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def kubelet(request: pytest.FixtureRequest, sock: str, pods_file: Path) -> Iterator[lab.SimulatedKubelet]:
    get = getattr(request, "param", "enabled")
    with lab.start(sock, pods_file, get=get) as server:
        yield server


@pytest.fixture
def client(sock: str) -> Iterator[PodResourcesClient]:
    with PodResourcesClient(sock, 1.0) as c:
        yield c


GRANTS = [GpuGrant("main", "nvidia.com/gpu", "GPU-aaaa", (0,)),
          GpuGrant("main", "nvidia.com/gpu", "GPU-bbbb", (0,)),
          GpuGrant("sidecar", "nvidia.com/gpu", "GPU-cccc::1", (1,))]


def test_get_answers_and_the_cache_keeps_it(kubelet: lab.SimulatedKubelet, client: PodResourcesClient) -> None:
    assert client.gpus_of("team-a", "train-0") == GRANTS
    assert kubelet.calls == {"Get": 1, "List": 0}
    assert client.gpus_of("team-a", "train-0", ("rdma/hca_shared",)) == [
        GpuGrant("main", "rdma/hca_shared", "mlx5_0", (0,))]
    assert kubelet.calls == {"Get": 1, "List": 0}   # from the cache
    client.forget("team-a", "train-0")
    assert client.gpus_of("team-a", "train-0", ("none",)) == []
    assert kubelet.calls == {"Get": 2, "List": 0}
    assert client.list_pods() == [_gpu_pod()]


@pytest.mark.parametrize("kubelet", ["disabled", "absent"], indirect=True)
def test_get_unavailable_falls_back_to_list_and_stays_there(
        kubelet: lab.SimulatedKubelet, client: PodResourcesClient, pods_file: Path) -> None:
    assert client.gpus_of("team-a", "train-0") == GRANTS
    # "absent" registers no Get at all (UNIMPLEMENTED), so the server never counts one.
    get_calls = 1 if kubelet.get == "disabled" else 0
    assert kubelet.calls == {"Get": get_calls, "List": 1}
    lab.add_pod(pods_file, _gpu_pod("team-b", "other"))
    assert [g.device_id for g in client.gpus_of("team-b", "other")] == ["GPU-aaaa", "GPU-bbbb", "GPU-cccc::1"]
    assert kubelet.calls == {"Get": get_calls, "List": 2}   # Get not asked again


def test_get_is_asked_again_after_the_reprobe_interval(sock: str, pods_file: Path) -> None:
    clock = FakeClock()
    with lab.start(sock, pods_file, get="disabled") as kubelet, \
            PodResourcesClient(sock, 1.0, clock=clock, cache_ttl=0.0) as client:
        client.gpus_of("team-a", "train-0")
        client.gpus_of("team-a", "train-0")
        assert kubelet.calls == {"Get": 1, "List": 2}
        clock.now += pr.GET_REPROBE_SECONDS
        client.gpus_of("team-a", "train-0")
        assert kubelet.calls == {"Get": 2, "List": 3}


def test_missing_pod_is_not_cached_and_appears_when_listed(
        kubelet: lab.SimulatedKubelet, client: PodResourcesClient, pods_file: Path) -> None:
    with pytest.raises(PodNotFound, match=r"kubelet.sock: no pod team-a/train-1 on this node"):
        client.gpus_of("team-a", "train-1")
    assert kubelet.calls == {"Get": 1, "List": 1}   # Get said "not found" (UNKNOWN): List decides
    lab.add_pod_devices(pods_file, "team-a", "train-1", "main", "nvidia.com/gpu", ["GPU-dddd"], [1])
    assert client.gpus_of("team-a", "train-1") == [GpuGrant("main", "nvidia.com/gpu", "GPU-dddd", (1,))]
    assert lab.remove_pod(pods_file, "team-a", "train-1") is True
    assert lab.remove_pod(pods_file, "team-a", "train-1") is False


def test_cache_ttl_and_size(sock: str, pods_file: Path) -> None:
    clock = FakeClock()
    lab.add_pod(pods_file, _gpu_pod("team-a", "train-1"))
    with lab.start(sock, pods_file) as kubelet, \
            PodResourcesClient(sock, 1.0, cache_ttl=10.0, cache_size=1, clock=clock) as client:
        client.gpus_of("team-a", "train-0")
        clock.now += 9.9
        client.gpus_of("team-a", "train-0")
        assert kubelet.calls["Get"] == 1
        clock.now += 0.2
        client.gpus_of("team-a", "train-0")
        assert kubelet.calls["Get"] == 2
        client.gpus_of("team-a", "train-1")     # evicts train-0 (cache_size 1)
        client.gpus_of("team-a", "train-0")
        assert kubelet.calls["Get"] == 4


def test_pods_file_changes_are_seen_and_a_missing_file_means_no_pods(
        kubelet: lab.SimulatedKubelet, client: PodResourcesClient, pods_file: Path) -> None:
    assert len(client.list_pods()) == 1
    lab.add_pod_devices(pods_file, "team-a", "train-0", "main", "nvidia.com/gpu", ["GPU-eeee"])
    lab.add_pod_devices(pods_file, "team-a", "train-0", "init", "nvidia.com/gpu", ["GPU-ffff"])
    pod = client.list_pods()[0]
    assert [c.name for c in pod.containers] == ["main", "sidecar", "init"]
    assert pod.containers[0].devices[-1] == ContainerDevices("nvidia.com/gpu", ("GPU-eeee",))
    pods_file.unlink()
    assert client.list_pods() == []


def test_missing_socket_is_named_with_the_cause(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.sock")
    start = time.monotonic()
    with PodResourcesClient(path, 60.0) as client, \
            pytest.raises(PodResourcesUnavailable, match=rf"{path}: no such socket \(kubelet not running"):
        client.gpus_of("team-a", "train-0")
    assert time.monotonic() - start < 30  # named at once, not after waiting out the 60 s bound


def test_kubelet_restart_is_reconnected_at_once(sock: str, pods_file: Path) -> None:
    with PodResourcesClient(sock, 30.0, cache_ttl=0.0) as client:
        with lab.start(sock, pods_file):
            assert client.gpus_of("team-a", "train-0") == GRANTS
        with pytest.raises(PodResourcesUnavailable, match="no such socket"):
            client.gpus_of("team-a", "train-0")
        # No reconnect backoff to wait out: the failed channel is gone, the next call makes a
        # fresh one (what happened, not a clock: < 0.5 s failed on a loaded machine).
        assert client._channel is None
        with lab.start(sock, pods_file):
            assert client.gpus_of("team-a", "train-0") == GRANTS


def test_grpc_missing_is_named(sock: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_grpc(name: str) -> Any:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(pr.importlib, "import_module", no_grpc)
    with PodResourcesClient(sock, 1.0) as client, \
            pytest.raises(PodResourcesError, match=r"kubelet.sock: the grpcio package is not installed"):
        client.gpus_of("team-a", "train-0")


def test_not_a_socket_and_a_stale_socket(tmp_path: Path) -> None:
    regular = tmp_path / "file.sock"
    regular.write_text("")
    with PodResourcesClient(str(regular), 1.0) as client, \
            pytest.raises(PodResourcesUnavailable, match="file.sock: exists but is not a socket"):
        client.list_pods()
    stale = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(stale)
    s.close()                                  # the file stays, nobody listens
    with PodResourcesClient(stale, 1.0) as client, \
            pytest.raises(PodResourcesUnavailable, match="stale.sock: connection refused: nobody listens"):
        client.gpus_of("a", "b")


def test_permission_denied_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root may connect anywhere, so the kernel's EACCES is played by a stand-in socket.
    path = tmp_path / "root-only.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))

    class Refusing:
        def __init__(self, *a: Any) -> None:
            pass

        def settimeout(self, t: float) -> None:
            pass

        def connect(self, p: str) -> None:
            raise PermissionError(13, "Permission denied")

        def close(self) -> None:
            pass

    monkeypatch.setattr(socket, "socket", Refusing)
    try:
        assert pr.diagnose_socket(str(path)) == "permission denied (the kubelet's socket is root's: run as root)"
    finally:
        listener.close()


def test_silent_socket_times_out_within_the_bound(tmp_path: Path) -> None:
    path = str(tmp_path / "silent.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(8)                         # accepts connections, never speaks HTTP/2
    try:
        start = time.monotonic()
        with PodResourcesClient(path, 0.15) as client, \
                pytest.raises(PodResourcesTimeout, match=r"silent.sock: no answer to Get within 0.15 s"):
            client.gpus_of("team-a", "train-0")
        # Not before the bound; the message names it, and 10 s only rules out a hang.
        assert 0.14 < time.monotonic() - start < 10
    finally:
        listener.close()


def test_stalled_kubelet_times_out_within_the_bound(sock: str, pods_file: Path) -> None:
    server = lab.start(sock, pods_file, get="disabled", delay=1.0)
    try:
        start = time.monotonic()
        # The bound covers the whole call: Get (1 s, "disabled") and the List after it (1 s
        # more: past the 1.5 s, which a bound per call would not be). 0.5 s either side.
        with PodResourcesClient(sock, 1.5) as client, \
                pytest.raises(PodResourcesTimeout, match=r"no answer to List within 1.5 s"):
            client.gpus_of("team-a", "train-0")
        assert time.monotonic() - start < 10  # and no hang
    finally:
        server.stop()


def test_server_error_is_named(kubelet: lab.SimulatedKubelet, client: PodResourcesClient,
                               pods_file: Path) -> None:
    pods_file.write_text("{not json")
    with pytest.raises(PodResourcesError, match=r"kubelet.sock: Get failed with INTERNAL: simulated "
                                                r"kubelet: .*pods.json: not JSON"):
        client.gpus_of("team-a", "train-0")


class _SlowClockTime:
    """Stands in for the `time` module of podresources: each monotonic() read is 0.05 s later
    than the last one, on top of the real clock. The RPC takes a few reads; decoding reads
    it every DEADLINE_EVERY elements — so the work done, not the machine's speed, decides."""

    def __init__(self) -> None:
        self.reads = 0

    def monotonic(self) -> float:
        self.reads += 1
        return time.monotonic() + 0.05 * self.reads


def test_the_timeout_bounds_decoding_too(raw_kubelet: Any, sock: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """3,000 pods (15,000 elements: 234 reads of the clock while decoding, 11.7 s of it)
    against a 5 s timeout: PodResourcesTimeout, naming the decoding; before, the decoding ran
    to its end whatever the timeout (200,000 pods: 3 s past a 2 s timeout)."""
    answer = encode_list_response(_tiny_pods(3000))
    raw_kubelet({"List": lambda req: answer})
    clock = _SlowClockTime()
    monkeypatch.setattr(pr, "time", clock)
    with PodResourcesClient(sock, 5.0) as client, \
            pytest.raises(PodResourcesTimeout, match=rf"kubelet.sock: the answer to List \({len(answer)} bytes\) "
                                                     r"was not decoded within 5 s: decoding not done"):
        client.list_pods()
    assert clock.reads < 5.0 / 0.05 + 10     # stopped at the deadline, not after 234 reads
    monkeypatch.undo()
    with PodResourcesClient(sock, 5.0) as client:  # the real clock: decoded well within 5 s
        assert len(client.list_pods()) == 3000


def test_too_many_pods_is_named(raw_kubelet: Any, sock: str) -> None:
    answer = encode_list_response(_tiny_pods(10_001))
    raw_kubelet({"List": lambda req: answer})
    # A time-out far above the work (≈ 0.1 s here): what is shown is the cap, not the clock,
    # also on a busy machine.
    with PodResourcesClient(sock, 30.0) as client, \
            pytest.raises(PodResourcesError, match=r"kubelet.sock: the answer to List is over the limit: "
                                                   r"more than 10000 pods: refused"):
        client.gpus_of("team-a", "train-0")


def test_oversized_answer_is_refused(kubelet: lab.SimulatedKubelet, sock: str, pods_file: Path) -> None:
    for i in range(20):
        lab.add_pod(pods_file, _gpu_pod("team-a", f"p{i}"))
    with PodResourcesClient(sock, 1.0, limits=Limits(max_bytes=500)) as client, \
            pytest.raises(PodResourcesError, match=r"List failed with RESOURCE_EXHAUSTED.*size limit"):
        client.list_pods()


@pytest.fixture
def raw_kubelet(sock: str) -> Iterator[Callable[[dict[str, Callable[[bytes], bytes]]], None]]:
    """A bare gRPC server answering the pod-resources methods with the given functions' bytes."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    servers = []

    def serve(methods: dict[str, Callable[[bytes], bytes]]) -> None:
        handlers = {m: grpc.unary_unary_rpc_method_handler(lambda req, ctx, f=f: f(req))
                    for m, f in methods.items()}
        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(pr.SERVICE, handlers),))
        server.add_insecure_port("unix:" + sock)
        server.start()
        servers.append(server)

    yield serve
    for server in servers:
        server.stop(None).wait()


def test_malformed_answer_is_named(raw_kubelet: Any, client: PodResourcesClient) -> None:
    raw_kubelet({"List": lambda req: b"\x0a\x05ab"})
    with pytest.raises(PodResourcesError, match=r"kubelet.sock: the answer to List is malformed: "
                                                r"field 1 at byte 2 is 5 bytes long"):
        client.gpus_of("team-a", "train-0")


def test_get_answering_another_pod_is_refused(raw_kubelet: Any, client: PodResourcesClient) -> None:
    raw_kubelet({"Get": lambda req: encode_get_response(_gpu_pod("team-b", "x"))})
    with pytest.raises(PodResourcesError, match=r"Get for pod team-a/train-0 answered pod team-b/x"):
        client.gpus_of("team-a", "train-0")


def test_duplicate_list_entries_are_refused(raw_kubelet: Any, client: PodResourcesClient) -> None:
    raw_kubelet({"List": lambda req: encode_list_response([_gpu_pod(), _gpu_pod()])})
    with pytest.raises(PodResourcesError, match=r"pod team-a/train-0 listed 2 times"):
        client.gpus_of("team-a", "train-0")


def test_client_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="timeout 0: a number of seconds > 0"):
        PodResourcesClient("/x.sock", 0)
    with pytest.raises(ValueError, match="longer than a unix socket path may be"):
        PodResourcesClient("/" + "x" * 120, 1.0)


def test_module_import_does_not_import_grpc() -> None:
    code = ("import sys, tenantnet.plugin.system.podresources, tenantnet.lab.podresources; "
            "sys.exit('grpc' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_runnable_background_server(sock: str, pods_file: Path) -> None:
    proc = lab.spawn(sock, pods_file)
    try:
        with PodResourcesClient(sock, 2.0) as client:
            assert client.gpus_of("team-a", "train-0") == GRANTS
    finally:
        assert lab.terminate(proc) == 0
    assert not os.path.exists(sock)


def test_pods_file_errors_name_the_place(tmp_path: Path) -> None:
    path = tmp_path / "pods.json"
    path.write_text('{"pods": [{"namespace": "a", "name": "b", "containers": '
                    '[{"name": "c", "devices": [{"resourceName": "r", "deviceIds": [1]}]}]}]}')
    with pytest.raises(lab.PodsFileError, match=r"pods\[0\].containers\[0\].devices\[0\].deviceIds: "
                                                r"a list of strings"):
        lab.read_pods(path)
    with pytest.raises(ValueError, match="get='sometimes'"):
        lab.SimulatedKubelet(tmp_path / "s.sock", path, get="sometimes")
    with pytest.raises(OSError, match=r"cannot listen on .*pods.json: a file that is not a socket"):
        lab.start(path, path)
    with pytest.raises(OSError, match=r"cannot listen on .*/no/s.sock: no directory"):
        lab.start(tmp_path / "no" / "s.sock", path)


# -- GPU device id → PCI address ------------------------------------------------------------

UUID_0 = "GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b"
UUID_1 = "GPU-1b724e78-eef5-4163-d43c-e4da15d41176"


def _information(uuid: str, bus: str, minor: int) -> str:
    # The layout of /proc/driver/nvidia/gpus/<pci>/information (a driver 535 H100's).
    return (f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 10\nGPU UUID: \t {uuid}\n"
            f"Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
            f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n"
            f"GPU Firmware: \t 535.129.03\nGPU Excluded:\t No\n")


@pytest.fixture
def procfs(tmp_path: Path) -> NvidiaProcfs:
    gpus = tmp_path / "proc" / "driver" / "nvidia" / "gpus"
    for uuid, bus, minor in ((UUID_0, "0000:1b:00.0", 0), (UUID_1, "0000:43:00.0", 1),
                             ("GPU-????????-????-????-????-????????????", "0000:51:00.0", 2)):
        (gpus / bus).mkdir(parents=True)
        (gpus / bus / "information").write_text(_information(uuid, bus, minor))
    (gpus / "not-a-gpu").mkdir()
    (gpus / "0000:9b:00.0").mkdir()            # no information file
    return NvidiaProcfs(str(tmp_path / "proc"))


def test_nvidia_procfs_maps_uuids_replicas_and_legacy_mig(procfs: NvidiaProcfs) -> None:
    ids = [UUID_1, UUID_0 + "::3", f"MIG-{UUID_0}/1/0", UUID_1.upper().replace("GPU-", "GPU-", 1)]
    assert gpu_pci_addresses(ids, procfs) == {
        UUID_1: "0000:43:00.0", UUID_0 + "::3": "0000:1b:00.0",
        f"MIG-{UUID_0}/1/0": "0000:1b:00.0", ids[3]: "0000:43:00.0"}
    assert gpu_pci_addresses([], procfs) == {}


def test_nvidia_procfs_names_what_it_cannot_map(procfs: NvidiaProcfs) -> None:
    mig = "MIG-4f3b2c7a-9d1e-5a8b-b6c4-2e1f0a9d8c7b"
    with pytest.raises(GpuMappingError) as err:
        gpu_pci_addresses([UUID_0, mig, "3", "GPU-0000"], procfs)
    message = str(err.value)
    assert f"/driver/nvidia/gpus/*/information: {mig}, 3, GPU-0000" in message
    assert "a MIG UUID names no GPU there: map it in the node config" in message
    assert "index ids (deviceIDStrategy: index)" in message
    assert "no readable UUID (not initialised? run nvidia-persistenced): 0000:51:00.0, 0000:9b:00.0" in message


def test_nvidia_procfs_without_the_driver(tmp_path: Path) -> None:
    with pytest.raises(GpuMappingError, match=r"proc/driver/nvidia/gpus: the nvidia kernel driver is not loaded"):
        gpu_pci_addresses([UUID_0], NvidiaProcfs(str(tmp_path / "proc")))


def test_explicit_mapping() -> None:
    mig = "MIG-4f3b2c7a-9d1e-5a8b-b6c4-2e1f0a9d8c7b"
    mapping = {UUID_0: "1B:00.0", mig: "0000:43:00.0", "7": "0000:c2:00.0"}
    assert gpu_pci_addresses([UUID_0 + "::1", f"MIG-{UUID_0}/2/0", mig, "7"], mapping) == {
        UUID_0 + "::1": "0000:1b:00.0", f"MIG-{UUID_0}/2/0": "0000:1b:00.0",
        mig: "0000:43:00.0", "7": "0000:c2:00.0"}
    with pytest.raises(GpuMappingError, match=rf"not in the explicit mapping: {UUID_1}, 8"):
        gpu_pci_addresses([UUID_1, "8"], mapping)
    with pytest.raises(GpuMappingError, match=r"GPU mapping 'GPU-x': '1b:00' is not a PCI address"):
        gpu_pci_addresses(["GPU-x"], {"GPU-x": "1b:00"})


def test_grants_map_to_pci_addresses(procfs: NvidiaProcfs) -> None:
    pod = PodResources("a", "b", (ContainerResources("main", (
        ContainerDevices("nvidia.com/gpu", (UUID_0, UUID_1), (0,)),)),))
    grants = pr.gpu_grants(pod)
    assert gpu_pci_addresses([g.device_id for g in grants], procfs) == {
        UUID_0: "0000:1b:00.0", UUID_1: "0000:43:00.0"}
