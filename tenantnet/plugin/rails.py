"""Rail alignment, pure logic: how far a GPU is from a NIC on the PCIe tree, and which VF each of
a pod's rails (its one-NIC-per-GPU networks) should take so that the rails and the pod's GPUs
pair up as closely as they can.

The positions come from `system/pcitree.py`; nothing here reads the host.

Distances, as `nvidia-smi topo -m` names them, from nearest to farthest
(PIX < PXB < PHB < NODE < SYS), derived from the two positions so:

- Different host bridges (root complexes): **NODE** if both devices report the same NUMA
  node, **SYS** otherwise — also when either reports none (numa_node -1): without knowing,
  crossing sockets is assumed. (On a single-socket machine or a VM that reports no NUMA
  node, two host bridges therefore show SYS where nvidia-smi would say NODE.)
- Same host bridge, no bridge in common (each below its own root port, or one directly on
  the host bridge's bus): **PHB** — the traffic turns at the host bridge.
- Same host bridge and at least one bridge in common: the path between them crosses the
  lowest common bridge and every bridge below it on either side. Those bridges are counted
  by switch (a switch's upstream and downstream ports are one switch; any other bridge, a
  root port for instance, counts alone): at most one → **PIX** (they share a switch: both
  below downstream ports of the same switch), more → **PXB** (several switches, the host
  bridge not crossed).

Pairing. A pod asks for rails; each rail takes one free VF from its pool of NICs (PFs) and is
paired with one of the pod's GPUs, each GPU paired at most once and, by default, each NIC used
by at most one rail of the pod (NIC:GPU 1:1). VFs of one NIC are interchangeable: they sit
where their PF sits. An assignment is judged lexicographically:

1. as many rails served (given a VF) as possible — a rail left without a VF fails its ADD;
2. then as many pairs within the limit (`within(distance, limit)`) as possible;
3. then the smallest total distance (PIX=1 … SYS=5; a served rail left without a GPU, when
   the pod has fewer GPUs than rails, counts 6).

`pair_rails` finds an optimal assignment exactly: it is a min-cost flow (source → rail →
NIC, capacity 1 per NIC → GPU → sink) whose costs encode the three criteria with weights
large enough that each one dominates the next, solved by successive shortest paths
(Bellman-Ford on the residual graph, as some costs are negative), which yields a min-cost
flow for every flow value; it stops when the next augmenting path no longer lowers the cost.
Sizes are a pod's rails and a node's NICs and GPUs (tens of graph nodes): about a millisecond
for 8 rails, 8 NICs and 8 GPUs in CPython.

Attach time sees one rail per CNI ADD (`choose_rail`). Choosing each rail's nearest free
GPU is the greedy trap: an earlier rail can take the one GPU a later rail could be aligned
with, while another GPU would have served the earlier rail within the limit too; and a rail
free to use several NICs can take the only NIC a later rail may use (the tests build both).
`choose_rail` instead solves the pod's whole remaining problem at every ADD — this rail, the
rails still to come, the GPUs and NICs the pod's earlier rails did not take — and takes this
rail's part of an optimum: this rail served first if it can be (its ADD is the one certain to
happen), and of the optimal assignments the one nearest for this rail (each nearer pair is
tried, nearest first, and kept if the rest can still be paired as well).

Guarantee: when the pod's remaining rails are given (`pending`, e.g. from the pod's network
list), every rail can be served, and the free VFs do not change between the pod's ADDs except
by its own, the rails end up paired exactly as well as `pair_rails` pairs them all at once:
what an optimal assignment gives the other rails is optimal for what is left, so each ADD's
optimum extends the previous ones (by induction; the tests check it against brute force).

Limits when `pending` is not given: `choose_rail` then assumes the pod will pair every GPU it
still has, through rails free to use any NIC with free VFs — right for the usual 8-GPU /
8-rail pod. A pod with fewer rails may see an early rail take a farther GPU to keep a nearer
one for a rail that never comes (only when keeping it makes the assumed pairing better, e.g.
more pairs within the limit), and rails whose pools are narrower than assumed can still be
misled (the NIC-pool trap above). Other pods taking VFs between two ADDs change the problem;
each ADD is optimal for what it sees. Pass `pending` to be exact.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

from tenantnet.plugin.system.pcitree import PciePosition


class Distance(IntEnum):
    """PCIe distance between a GPU and a NIC, ordered PIX < PXB < PHB < NODE < SYS."""

    PIX = 1  # through at most one PCIe switch (they share it)
    PXB = 2  # through several PCIe switches, not through the host bridge
    PHB = 3  # through the host bridge (root complex) they share
    NODE = 4  # between host bridges of one NUMA node
    SYS = 5  # across NUMA nodes (the socket interconnect), or NUMA node unknown


NO_GPU_COST = 6  # a served rail left without a GPU: one step past SYS, in the total distance


def parse_distance(text: object, field: str = "within") -> Distance:
    """`"PIX"` … `"SYS"` (any case) → Distance; ValueError naming the field and the allowed values."""
    if isinstance(text, str) and text.upper() in Distance.__members__:
        return Distance[text.upper()]
    allowed = "|".join(Distance.__members__)
    raise ValueError(f"{field}: {text!r} is not a PCIe distance; allowed: {allowed} (nearest first)")


def within(level: Distance, limit: Distance) -> bool:
    """Whether `level` is at most `limit` (PIX is within every limit, SYS only within SYS)."""
    return level <= limit


def classify(gpu: PciePosition, nic: PciePosition) -> Distance:
    """The distance between two positions (see the module docstring for the rules)."""
    if gpu.host_bridge != nic.host_bridge:
        if gpu.numa_node is not None and gpu.numa_node == nic.numa_node:
            return Distance.NODE
        return Distance.SYS
    common = 0
    for a, b in zip(gpu.upstream, nic.upstream, strict=False):
        if a.address != b.address:
            break
        common += 1
    if common == 0:
        return Distance.PHB
    crossed = gpu.upstream[common - 1:] + nic.upstream[common:]
    units = {b.switch if b.switch is not None else b.address for b in crossed}
    return Distance.PIX if len(units) <= 1 else Distance.PXB


def distance_table(
    gpus: Iterable[PciePosition], nics: Iterable[PciePosition]
) -> dict[tuple[str, str], Distance]:
    """{(GPU address, NIC address): distance} for every pair."""
    nic_list = list(nics)
    return {(g.address, n.address): classify(g, n) for g in gpus for n in nic_list}


# -- pairing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rail:
    """One rail of a pod: a network, named as the caller likes (its ifname, its NAD)."""

    name: str
    nics: frozenset[str] | None = None  # the NICs (PF addresses) its VF may come from; None: any


@dataclass(frozen=True)
class Pairing:
    """What a rail gets: a VF of a NIC, and the GPU it is paired with (None: none left)."""

    rail: str
    nic: str
    vf: str
    gpu: str | None
    distance: Distance | None


@dataclass(frozen=True)
class Assignment:
    """The rails' VFs and GPUs; `unserved` rails found no free VF in their pool."""

    pairings: tuple[Pairing, ...]  # in the order the rails were given
    unserved: tuple[str, ...]
    limit: Distance

    @property
    def within_limit(self) -> int:
        """Pairs whose distance is within the limit."""
        return sum(1 for p in self.pairings if p.distance is not None and within(p.distance, self.limit))

    @property
    def total_distance(self) -> int:
        """Sum of the pairs' distances; a served rail without a GPU counts NO_GPU_COST."""
        return sum(int(p.distance) if p.distance is not None else NO_GPU_COST for p in self.pairings)

    @property
    def score(self) -> tuple[int, int, int]:
        """What is maximised, lexicographically: (rails served, pairs within the limit, −total distance)."""
        return len(self.pairings), self.within_limit, -self.total_distance

    def of(self, rail: str) -> Pairing | None:
        return next((p for p in self.pairings if p.rail == rail), None)


def pair_rails(
    rails: int | Sequence[Rail],
    gpus: Sequence[str],
    free_vfs: Mapping[str, Sequence[str]],
    distances: Mapping[tuple[str, str], Distance],
    *,
    limit: Distance = Distance.SYS,
    distinct_nics: bool = True,
) -> Assignment:
    """An optimal assignment of VFs and GPUs to `rails` (a count: that many rails named "0",
    "1", … each free to use any NIC).

    `gpus`: the pod's GPUs (PCI addresses). `free_vfs`: NIC (PF address) → its free VFs, in the
    order they should be taken. `distances`: (GPU, NIC) → distance for every pair that can
    occur (`distance_table`). `distinct_nics`: at most one rail of the pod per NIC.
    """
    rail_list = [Rail(str(i)) for i in range(rails)] if isinstance(rails, int) else list(rails)
    return _solve(rail_list, {}, gpus, free_vfs, distances, limit, distinct_nics)


def choose_rail(
    rail: Rail,
    gpus: Sequence[str],
    free_vfs: Mapping[str, Sequence[str]],
    distances: Mapping[tuple[str, str], Distance],
    *,
    paired: Iterable[Pairing] = (),
    pending: Sequence[Rail] | None = None,
    limit: Distance = Distance.SYS,
    distinct_nics: bool = True,
) -> Pairing | None:
    """The VF and GPU for one rail at ADD time; None if its pool has no free VF.

    `paired`: what the pod's earlier rails got (their GPUs, and with `distinct_nics` their
    NICs, are not offered again). `pending`: the pod's rails still to come, if known; None:
    assume one rail per GPU still unpaired, each free to use any NIC (module docstring).
    """
    earlier = list(paired)
    taken_gpus = {p.gpu for p in earlier if p.gpu is not None}
    taken_vfs = {p.vf for p in earlier}
    taken_nics = {p.nic for p in earlier} if distinct_nics else set()
    left_gpus = [g for g in gpus if g not in taken_gpus]
    left_vfs = {nic: [vf for vf in vfs if vf not in taken_vfs]
                for nic, vfs in free_vfs.items() if nic not in taken_nics}
    if pending is None:
        # Never a real rail's name: those come from ifnames and NADs, which hold no NUL.
        pending = [Rail(f"\x00assumed-{i}") for i in range(max(len(left_gpus) - 1, 0))]
    found = _solve([rail, *pending], {rail.name: 1}, left_gpus, left_vfs, distances, limit, distinct_nics)
    mine = found.of(rail.name)
    if mine is None:
        return None
    # Optima are rarely unique. Of them, take the one best for this rail — its ADD is the one
    # certain to happen: try each pair nearer than the one it got, nearest first, and keep
    # the first with which the rest can still be paired as well as in `found`.
    nearer = sorted(
        (_rank_of(distances[(g, n)] if g is not None else None), n, i, g)
        for n, vfs in left_vfs.items() if vfs and _allows(rail.nics, n)
        for i, g in enumerate([*left_gpus, None])
    )
    for rank, nic, _, gpu in nearer:
        if rank >= _rank_of(mine.distance):
            break
        vf = left_vfs[nic][0]
        rest_vfs = {n: [v for v in vfs if v != vf]
                    for n, vfs in left_vfs.items() if not (distinct_nics and n == nic)}
        rest_gpus = [g for g in left_gpus if g != gpu]
        rest = _solve(list(pending), {}, rest_gpus, rest_vfs, distances, limit, distinct_nics)
        d = distances[(gpu, nic)] if gpu is not None else None
        score = (len(rest.pairings) + 1, rest.within_limit + (d is not None and within(d, limit)),
                 -(rest.total_distance + _rank_of(d)))
        if score == found.score:
            return Pairing(rail=rail.name, nic=nic, vf=vf, gpu=gpu, distance=d)
    return mine


# -- the solver -------------------------------------------------------------------------------


@dataclass
class _Edge:
    to: int
    capacity: int
    cost: int
    reverse: int  # index of the reverse edge in graph[to]


class _Flow:
    """A min-cost flow network, successive shortest paths (Bellman-Ford, as costs are negative)."""

    def __init__(self, nodes: int) -> None:
        self.graph: list[list[_Edge]] = [[] for _ in range(nodes)]

    def add(self, a: int, b: int, capacity: int, cost: int) -> _Edge:
        edge = _Edge(b, capacity, cost, len(self.graph[b]))
        self.graph[a].append(edge)
        self.graph[b].append(_Edge(a, 0, -cost, len(self.graph[a]) - 1))
        return edge

    def minimise(self, source: int, sink: int) -> None:
        """Augment one unit at a time along a cheapest path while that lowers the total cost.

        Each augmentation along a shortest path keeps the flow a min-cost flow of its value
        (no negative cycle in the residual graph), and the cost of the next shortest path never
        decreases, so stopping at the first non-negative one gives the min-cost flow of any value.
        """
        n = len(self.graph)
        while True:
            # Bellman-Ford with a queue (SPFA): only nodes whose distance dropped are rescanned.
            dist: list[int | None] = [None] * n
            via: list[tuple[int, int] | None] = [None] * n
            dist[source] = 0
            queue, queued = deque([source]), [False] * n
            queued[source] = True
            while queue:
                a = queue.popleft()
                queued[a] = False
                da = dist[a]
                assert da is not None
                for i, e in enumerate(self.graph[a]):
                    if e.capacity > 0:
                        d = da + e.cost
                        db = dist[e.to]
                        if db is None or d < db:
                            dist[e.to], via[e.to] = d, (a, i)
                            if not queued[e.to]:
                                queue.append(e.to)
                                queued[e.to] = True
            total = dist[sink]
            if total is None or total >= 0:
                return
            node = sink
            while node != source:
                step = via[node]
                assert step is not None
                a, i = step
                edge = self.graph[a][i]
                edge.capacity -= 1
                self.graph[edge.to][edge.reverse].capacity += 1
                node = a


def _solve(
    rails: list[Rail],
    priority: Mapping[str, int],
    gpus: Sequence[str],
    free_vfs: Mapping[str, Sequence[str]],
    distances: Mapping[tuple[str, str], Distance],
    limit: Distance,
    distinct_nics: bool,
) -> Assignment:
    names = [r.name for r in rails]
    if len(set(names)) != len(names):
        raise ValueError(f"rail names must be distinct, got {names}")
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"GPUs must be distinct, got {list(gpus)}")
    nics = sorted(n for n, vfs in free_vfs.items() if vfs)
    for g in gpus:
        for n in nics:
            if (g, n) not in distances:
                raise ValueError(f"no PCIe distance known between GPU {g} and NIC {n}")

    # Weights: each criterion outweighs everything the next one can add up to.
    r = len(rails)
    beyond = NO_GPU_COST * r + 1  # a pair outside the limit
    serve = r * (beyond + NO_GPU_COST) + 1  # a rail served
    first = (r + 1) * serve  # the rail with priority served (choose_rail's own rail)

    source, sink, no_gpu = 0, 1, 2
    rail_node = {name: 3 + i for i, name in enumerate(names)}
    nic_in = {n: 3 + r + 2 * i for i, n in enumerate(nics)}
    nic_out = {n: 4 + r + 2 * i for i, n in enumerate(nics)}
    gpu_node = {g: 3 + r + 2 * len(nics) + i for i, g in enumerate(gpus)}
    flow = _Flow(3 + r + 2 * len(nics) + len(gpus))

    rail_edges: dict[str, list[tuple[str, _Edge]]] = {}
    for rail in rails:
        flow.add(source, rail_node[rail.name], 1, -(first if priority.get(rail.name) else serve))
        rail_edges[rail.name] = [
            (n, flow.add(rail_node[rail.name], nic_in[n], 1, 0))
            for n in nics if rail.nics is None or n in rail.nics
        ]
    pair_edges: dict[str, list[tuple[str, _Edge]]] = {}
    for n in nics:
        flow.add(nic_in[n], nic_out[n], 1 if distinct_nics else len(free_vfs[n]), 0)
        pair_edges[n] = []
        for g in gpus:
            d = distances[(g, n)]
            cost = int(d) + (0 if within(d, limit) else beyond)
            pair_edges[n].append((g, flow.add(nic_out[n], gpu_node[g], 1, cost)))
        pair_edges[n].append(("", flow.add(nic_out[n], no_gpu, r, NO_GPU_COST + beyond)))
    for g in gpus:
        flow.add(gpu_node[g], sink, 1, 0)
    flow.add(no_gpu, sink, r, 0)
    flow.minimise(source, sink)

    # Read the flow back: each NIC's rails and GPUs (a NIC may carry several when not distinct).
    gpus_of: dict[str, list[str | None]] = {}
    for n in nics:
        out: list[str | None] = []
        for g, e in pair_edges[n]:
            used = (r if g == "" else 1) - e.capacity
            out.extend([g or None] * used)
        gpus_of[n] = out
    vf_next = dict.fromkeys(nics, 0)
    pairings: list[Pairing] = []
    unserved: list[str] = []
    for rail in rails:
        nic = next((n for n, e in rail_edges[rail.name] if e.capacity == 0), None)
        if nic is None:
            unserved.append(rail.name)
            continue
        gpu = gpus_of[nic].pop(0)
        pairings.append(Pairing(rail=rail.name, nic=nic, vf=free_vfs[nic][vf_next[nic]], gpu=gpu,
                                distance=distances[(gpu, nic)] if gpu is not None else None))
        vf_next[nic] += 1
    return Assignment(pairings=tuple(pairings), unserved=tuple(unserved), limit=limit)


def _allows(pool: frozenset[str] | None, nic: str) -> bool:
    return pool is None or nic in pool


def _rank_of(distance: Distance | None) -> int:
    return int(distance) if distance is not None else NO_GPU_COST
