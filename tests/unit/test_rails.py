"""Rail alignment: PCIe distance classification on simulated trees (every level, a NIC with its
own root port, an unknown NUMA node, the 8-GPU / 8-NIC server), and the pairing of rails with
GPUs — where greedy per-rail choices fail and the exact matching does not, at once and one
rail per ADD, and against brute force on random distance matrices."""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenantnet.lab.nicsysfs import connectx_pf
from tenantnet.lab.pcitree import SimPcieTree
from tenantnet.plugin.rails import (
    NO_GPU_COST,
    Distance,
    Pairing,
    Rail,
    choose_rail,
    classify,
    distance_table,
    pair_rails,
    parse_distance,
    within,
)
from tenantnet.plugin.system.pcitree import PcieTree
from tests.unit.test_pcitree import hgx_root

PIX, PXB, PHB, NODE, SYS = Distance.PIX, Distance.PXB, Distance.PHB, Distance.NODE, Distance.SYS


def free_vfs_of(tree: PcieTree) -> dict[str, list[str]]:
    """Every VF of every NIC, as the free pool (the tests' nodes have no pod yet)."""
    devices = os.path.join(tree.root, "bus", "pci", "devices")
    out: dict[str, list[str]] = {n.address: [] for n in tree.nics()}
    for name in sorted(os.listdir(devices)):
        physfn = os.path.join(devices, name, "physfn")
        if os.path.islink(physfn):
            out[os.path.basename(os.readlink(physfn))].append(name)
    return out


def table(tree: PcieTree) -> dict[tuple[str, str], Distance]:
    return distance_table([g.position for g in tree.gpus()], [n.position for n in tree.nics()])


def greedy(rails, gpus, free_vfs, distances, distinct_nics=True):
    """What a per-ADD nearest-first choice does: each rail in turn takes the nearest (NIC, GPU)
    its pool and the pod's free GPUs allow (ties: first NIC, then first GPU)."""
    used_gpus, used_nics, out = set(), set(), []
    for rail in rails:
        options = [(distances[(g, n)], ni, gi, n, g)
                   for ni, n in enumerate(sorted(free_vfs)) if free_vfs[n]
                   and (rail.nics is None or n in rail.nics) and not (distinct_nics and n in used_nics)
                   for gi, g in enumerate(gpus) if g not in used_gpus]
        if options:
            d, _, _, n, g = min(options)
            used_gpus.add(g)
            used_nics.add(n)
            out.append((rail.name, n, g, d))
    return out


def sequential(rails, gpus, free_vfs, distances, *, limit=SYS, tell_pending=True, distinct_nics=True):
    """One `choose_rail` per rail, in order, as CNI ADDs arrive; VFs taken leave the free pool."""
    free = {n: list(v) for n, v in free_vfs.items()}
    paired: list[Pairing] = []
    for i, rail in enumerate(rails):
        p = choose_rail(rail, gpus, free, distances, paired=paired, limit=limit, distinct_nics=distinct_nics,
                        pending=rails[i + 1:] if tell_pending else None)
        if p is not None:
            paired.append(p)
            free[p.nic].remove(p.vf)
    return paired


# -- trees ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hgx(tmp_path_factory):
    return PcieTree(str(hgx_root(tmp_path_factory)))


@pytest.fixture(scope="module")
def levels(tmp_path_factory):
    """Every level from one GPU (g0), each NIC named for what it should be:

    pci0000:20 (NUMA 0) ─ root port 20:01.0 ─ switch T ─┬─ switch S ─┬─ g0 25:00.0
                        │                              │            └─ pix 26:00.0
                        │                              ├─ pxb 27:00.0
                        │                              └─ g1 28:00.0
                        ├─ root port 20:02.0 ─ phb 29:00.0  (its own root port, no switch)
                        └─ g2 20:05.0  (on the host bridge's own bus)
    pci0000:40 (NUMA 0) ─ root port ─ node 41:00.0
    pci0000:60 (NUMA 1) ─ root port ─ sys 61:00.0
    pci0000:70 (NUMA 0) ─ root port ─ unk 71:00.0 (numa_node -1)
    """
    t = SimPcieTree()
    a = t.host_bridge("0000:20", numa_node=0)
    rp = t.root_port(a, "0000:20:01.0")
    to_s, to_pxb, to_g1 = t.switch(rp, "0000:21:00.0", ["0000:22:00.0", "0000:22:01.0", "0000:22:02.0"])
    to_g0, to_pix = t.switch(to_s, "0000:23:00.0", ["0000:24:00.0", "0000:24:01.0"])
    t.gpu(to_g0, "0000:25:00.0")
    t.nic(to_pix, connectx_pf("pix", vfs=1, bus="26"))
    t.nic(to_pxb, connectx_pf("pxb", vfs=1, bus="27"))
    t.gpu(to_g1, "0000:28:00.0")
    t.nic(t.root_port(a, "0000:20:02.0"), connectx_pf("phb", vfs=1, bus="29"))
    t.gpu(a, "0000:20:05.0")
    t.nic(t.root_port(t.host_bridge("0000:40", numa_node=0), "0000:40:01.0"), connectx_pf("node", vfs=1, bus="41"))
    t.nic(t.root_port(t.host_bridge("0000:60", numa_node=1), "0000:60:01.0"), connectx_pf("sys", vfs=1, bus="61"))
    t.nic(t.root_port(t.host_bridge("0000:70", numa_node=0), "0000:70:01.0"), connectx_pf("unk", vfs=1, bus="71"),
          numa_node=-1)
    root = tmp_path_factory.mktemp("levels")
    t.write(root)
    return PcieTree(str(root))


G0, G1, G2 = "0000:25:00.0", "0000:28:00.0", "0000:20:05.0"
NICS = {"pix": "0000:26:00.0", "pxb": "0000:27:00.0", "phb": "0000:29:00.0", "node": "0000:41:00.0",
        "sys": "0000:61:00.0", "unk": "0000:71:00.0"}


# -- classification ----------------------------------------------------------------------------


@pytest.mark.parametrize("nic, expected", [
    ("pix", PIX),    # below downstream ports of one switch (S)
    ("pxb", PXB),    # across S and T, below one root port
    ("phb", PHB),    # its own root port on g0's host bridge
    ("node", NODE),  # another host bridge, same NUMA node
    ("sys", SYS),    # the other socket
    ("unk", SYS),    # another host bridge, NUMA node unknown: assumed across sockets
])
def test_every_level_from_one_gpu(levels, nic, expected):
    assert classify(levels.position(G0), levels.position(NICS[nic])) is expected


def test_levels_from_other_places(levels):
    pos = levels.position
    # g1 sits on switch T itself: PIX with the NIC on T, PXB with the one below S.
    assert classify(pos(G1), pos(NICS["pxb"])) is PIX and classify(pos(G1), pos(NICS["pix"])) is PXB
    # g2, on the host bridge's own bus, shares no bridge with anything: PHB across its host bridge.
    assert {classify(pos(G2), pos(NICS[n])) for n in ("pix", "pxb", "phb")} == {PHB}
    # A VF is where its PF is.
    assert classify(pos(G0), pos("0000:26:00.2")) is PIX
    # Symmetric.
    assert all(classify(pos(a), pos(b)) is classify(pos(b), pos(a))
               for a in (G0, G1, G2) for b in NICS.values())


def test_unknown_numa_on_the_same_host_bridge_is_still_phb(tmp_path):
    t = SimPcieTree()
    hb = t.host_bridge("0000:20", numa_node=0)
    t.gpu(t.root_port(hb, "0000:20:01.0"), "0000:21:00.0", numa_node=-1)
    t.nic(t.root_port(hb, "0000:20:02.0"), connectx_pf("n", vfs=1, bus="22"), numa_node=-1)
    t.write(tmp_path)
    tree = PcieTree(str(tmp_path))
    assert classify(tree.position("0000:21:00.0"), tree.position("0000:22:00.0")) is PHB


def test_hgx_diagonal_is_pix(hgx):
    d = table(hgx)
    gpus, nics = [g.address for g in hgx.gpus()], [n.address for n in hgx.nics()]
    assert [d[(gpus[i], nics[i])] for i in range(8)] == [PIX] * 8
    names = {PIX: "X", PHB: "H", NODE: "N", SYS: "S"}
    assert ["".join(names[d[(g, n)]] for n in nics) for g in gpus] == [
        "XNNNSSSS", "NXNNSSSS", "NNXNSSSS", "NNNXSSSS",
        "SSSSXNNN", "SSSSNXNN", "SSSSNNXN", "SSSSNNNX"]


def test_order_within_and_parse():
    assert PIX < PXB < PHB < NODE < SYS
    assert within(PIX, PIX) and within(PHB, NODE) and not within(NODE, PHB) and within(SYS, SYS)
    assert parse_distance("pxb") is PXB and parse_distance("NODE") is NODE
    with pytest.raises(ValueError, match=r"railAlignment.within: 'NVL' is not a PCIe distance; "
                                         r"allowed: PIX\|PXB\|PHB\|NODE\|SYS \(nearest first\)"):
        parse_distance("NVL", "railAlignment.within")
    with pytest.raises(ValueError, match="within: 3 is not a PCIe distance"):
        parse_distance(3)


# -- pairing on the 8-GPU server ----------------------------------------------------------------


def test_hgx_eight_rails_get_the_diagonal(hgx):
    gpus, free, d = [g.address for g in hgx.gpus()], free_vfs_of(hgx), table(hgx)
    got = pair_rails(8, gpus, free, d, limit=PIX)
    assert got.unserved == () and got.score == (8, 8, -8)
    assert {(p.gpu, p.nic) for p in got.pairings} == {(g, n.address) for g, n in zip(gpus, hgx.nics(), strict=True)}
    assert all(p.vf == free[p.nic][0] for p in got.pairings)


def test_hgx_one_rail_per_add_in_any_order_gets_the_diagonal(hgx):
    gpus, free, d = [g.address for g in hgx.gpus()], free_vfs_of(hgx), table(hgx)
    nics = [n.address for n in hgx.nics()]
    # Each rail's NAD names its own NIC; ADDs arrive in a scrambled order; nobody says what comes next.
    rails = [Rail(f"net{i}", frozenset({nics[i]})) for i in (5, 0, 7, 2, 3, 6, 1, 4)]
    got = sequential(rails, gpus, free, d, limit=PIX, tell_pending=False)
    assert sorted((p.gpu, p.nic, p.distance) for p in got) == sorted(
        (g, n, PIX) for g, n in zip(gpus, nics, strict=True))
    # Every rail free to use any NIC, the pod's GPUs given in reverse: still the diagonal.
    got = sequential([Rail(f"net{i}") for i in range(8)], gpus[::-1], free, d, tell_pending=False)
    assert {p.distance for p in got} == {PIX} and len({p.nic for p in got}) == 8


def test_pod_with_four_gpus_on_a_busy_node(hgx):
    gpus, free, d = [g.address for g in hgx.gpus()], free_vfs_of(hgx), table(hgx)
    nics = [n.address for n in hgx.nics()]
    free[nics[0]] = []  # NIC 0 has no free VF left
    got = pair_rails(4, gpus[:4], free, d, limit=PIX)
    # GPUs 1-3 keep their PIX NICs; GPU 0 goes to the other socket rather than take NIC 1 (NODE)
    # and push GPU 1 off its switch: three pairs within PIX beat a shorter total.
    by_gpu = {p.gpu: (p.nic, p.distance) for p in got.pairings}
    assert [by_gpu[g] for g in gpus[1:4]] == [(nics[1], PIX), (nics[2], PIX), (nics[3], PIX)]
    assert by_gpu[gpus[0]][1] is SYS and got.score == (4, 3, -8)
    assert got.total_distance == min(sum(d[(g, n)] for g, n in zip(gpus[:4], perm, strict=True))
                                     for perm in itertools.permutations(nics[1:], 4))


def test_more_rails_than_gpus_and_shared_nics(hgx):
    gpus, free, d = [g.address for g in hgx.gpus()], free_vfs_of(hgx), table(hgx)
    nics = [n.address for n in hgx.nics()]
    got = pair_rails(3, gpus[:2], free, d)
    assert got.score == (3, 2, -(1 + 1 + NO_GPU_COST))  # the third rail gets a VF, no GPU
    assert sorted(p.gpu or "" for p in got.pairings) == ["", gpus[0], gpus[1]]
    # Two rails on one NIC when the pod allows it: both VFs of NIC 0, GPUs 0 and 1.
    pool = frozenset({nics[0]})
    got = pair_rails([Rail("a", pool), Rail("b", pool)], gpus[:2], free, d, distinct_nics=False)
    assert [p.vf for p in got.pairings] == free[nics[0]]
    assert sorted((p.gpu, p.distance) for p in got.pairings) == [(gpus[0], PIX), (gpus[1], NODE)]
    # Without that, the second rail finds nothing.
    got = pair_rails([Rail("a", pool), Rail("b", pool)], gpus[:2], free, d)
    assert len(got.pairings) == 1 and got.unserved == ("b",)


# -- greedy traps ------------------------------------------------------------------------------


def test_unknown_numa_trap(tmp_path):
    """A–g0 PIX, A–g1 PHB, B–g0 NODE, B–g1 SYS (g1 reports no NUMA node). Within NODE, the
    1:1 pairing is A–g1, B–g0; nearest-first gives A g0 and leaves B with g1 (SYS)."""
    t = SimPcieTree()
    h = t.host_bridge("0000:10", numa_node=0)
    to_g0, to_a = t.switch(t.root_port(h, "0000:10:01.0"), "0000:11:00.0", ["0000:12:00.0", "0000:12:01.0"])
    t.gpu(to_g0, "0000:13:00.0")
    t.nic(to_a, connectx_pf("a", vfs=1, bus="14"))
    t.gpu(t.root_port(h, "0000:10:02.0"), "0000:15:00.0", numa_node=-1)
    t.nic(t.root_port(t.host_bridge("0000:50", numa_node=0), "0000:50:01.0"), connectx_pf("b", vfs=1, bus="51"))
    t.write(tmp_path)
    tree = PcieTree(str(tmp_path))
    g0, g1, a, b = "0000:13:00.0", "0000:15:00.0", "0000:14:00.0", "0000:51:00.0"
    d = table(tree)
    assert (d[(g0, a)], d[(g1, a)], d[(g0, b)], d[(g1, b)]) == (PIX, PHB, NODE, SYS)
    rails = [Rail("rail-a", frozenset({a})), Rail("rail-b", frozenset({b}))]
    free = free_vfs_of(tree)

    trap = greedy(rails, [g0, g1], free, d)
    assert trap == [("rail-a", a, g0, PIX), ("rail-b", b, g1, SYS)]  # only one pair within NODE

    best = pair_rails(rails, [g0, g1], free, d, limit=NODE)
    assert [(p.rail, p.gpu, p.distance) for p in best.pairings] == [("rail-a", g1, PHB), ("rail-b", g0, NODE)]
    assert best.within_limit == 2
    # One rail per ADD finds it too, even without being told rail-b is coming.
    for tell in (True, False):
        got = sequential(rails, [g0, g1], free, d, limit=NODE, tell_pending=tell)
        assert [(p.rail, p.gpu) for p in got] == [("rail-a", g1), ("rail-b", g0)]


def test_pool_trap(hgx):
    """rail-1 may use NIC 0 or NIC 1, rail-2 only NIC 0. Nearest-first gives rail-1 NIC 0 (PIX
    with GPU 0) and leaves rail-2 without a VF; the 1:1 pairing is rail-1 NIC 1, rail-2 NIC 0."""
    gpus, free, d = [g.address for g in hgx.gpus()][:2], free_vfs_of(hgx), table(hgx)
    n0, n1 = [n.address for n in hgx.nics()][:2]
    rails = [Rail("rail-1", frozenset({n0, n1})), Rail("rail-2", frozenset({n0}))]
    assert [r for r, *_ in greedy(rails, gpus, free, d)] == ["rail-1"]  # rail-2 starved
    best = pair_rails(rails, gpus, free, d, limit=PIX)
    assert [(p.rail, p.nic, p.gpu) for p in best.pairings] == [("rail-1", n1, gpus[1]), ("rail-2", n0, gpus[0])]
    assert best.score == (2, 2, -2)
    # Per ADD, told what is pending: the same.
    got = sequential(rails, gpus, free, d, limit=PIX, tell_pending=True)
    assert [(p.rail, p.nic, p.gpu) for p in got] == [("rail-1", n1, gpus[1]), ("rail-2", n0, gpus[0])]
    # Not told, the rails' pools cannot be guessed: the documented limit. rail-1 takes NIC 0.
    got = sequential(rails, gpus, free, d, limit=PIX, tell_pending=False)
    assert [(p.rail, p.nic) for p in got] == [("rail-1", n0)]


def test_distance_trap_on_a_plain_tree(tmp_path):
    """No unknowns: X–g0 PIX, Y–g0 PXB, X–g1 = Y–g1 PHB. With Y's ADD first, nearest-first gives
    Y g0 and X g1 (2 + 3); the optimum is X g0 and Y g1 (1 + 3)."""
    t = SimPcieTree()
    h = t.host_bridge("0000:10")
    to_s, to_s2 = t.switch(t.root_port(h, "0000:10:01.0"), "0000:11:00.0", ["0000:12:00.0", "0000:12:01.0"])
    to_g0, to_x = t.switch(to_s, "0000:13:00.0", ["0000:14:00.0", "0000:14:01.0"])
    (to_y,) = t.switch(to_s2, "0000:17:00.0", ["0000:18:00.0"])
    t.gpu(to_g0, "0000:15:00.0")
    t.nic(to_x, connectx_pf("x", vfs=1, bus="16"))
    t.nic(to_y, connectx_pf("y", vfs=1, bus="19"))
    t.gpu(t.root_port(h, "0000:10:02.0"), "0000:1a:00.0")
    t.write(tmp_path)
    tree = PcieTree(str(tmp_path))
    g0, g1, x, y = "0000:15:00.0", "0000:1a:00.0", "0000:16:00.0", "0000:19:00.0"
    d, free = table(tree), free_vfs_of(tree)
    assert (d[(g0, x)], d[(g0, y)], d[(g1, x)], d[(g1, y)]) == (PIX, PXB, PHB, PHB)
    rails = [Rail("y", frozenset({y})), Rail("x", frozenset({x}))]
    assert [(r, g) for r, _, g, _ in greedy(rails, [g0, g1], free, d)] == [("y", g0), ("x", g1)]
    assert pair_rails(rails, [g0, g1], free, d).total_distance == 4
    got = sequential(rails, [g0, g1], free, d, tell_pending=False)
    assert [(p.rail, p.gpu) for p in got] == [("y", g1), ("x", g0)]


def test_choose_rail_takes_the_optimum_nearest_for_itself():
    # Both NICs are PIX with g0 and SYS with g1: the assumed second rail makes every pairing
    # equally good overall, so the rail whose ADD this is takes g0, not g1.
    d = {("g0", "a"): PIX, ("g1", "a"): SYS, ("g0", "b"): PIX, ("g1", "b"): SYS}
    free = {"a": ["a0"], "b": ["b0"]}
    for gpus in (["g0", "g1"], ["g1", "g0"]):
        got = choose_rail(Rail("r", frozenset({"a"})), gpus, free, d, limit=PIX)
        assert got == Pairing("r", "a", "a0", "g0", PIX)


def test_bad_input():
    with pytest.raises(ValueError, match=r"rail names must be distinct, got \['a', 'a'\]"):
        pair_rails([Rail("a"), Rail("a")], ["g"], {"n": ["v"]}, {("g", "n"): PIX})
    with pytest.raises(ValueError, match="no PCIe distance known between GPU g and NIC m"):
        pair_rails(1, ["g"], {"n": ["v"], "m": ["w"]}, {("g", "n"): PIX})
    with pytest.raises(ValueError, match="GPUs must be distinct"):
        pair_rails(1, ["g", "g"], {"n": ["v"]}, {("g", "n"): PIX})
    assert pair_rails(2, [], {}, {}).unserved == ("0", "1")
    assert choose_rail(Rail("a"), ["g"], {"n": []}, {("g", "n"): PIX}) is None


# -- against brute force -----------------------------------------------------------------------


def brute_force(rails, gpus, free_vfs, distances, limit, distinct_nics):
    """The best score over every assignment: each rail unserved or on a NIC of its pool with a GPU or none."""
    nics = sorted(n for n, v in free_vfs.items() if v)
    best = None
    options = [[None] + [(n, g) for n in nics if r.nics is None or n in r.nics for g in [*gpus, None]]
               for r in rails]
    for combo in itertools.product(*options):
        chosen = [c for c in combo if c is not None]
        used_gpus = [g for _, g in chosen if g is not None]
        if len(set(used_gpus)) != len(used_gpus):
            continue
        per_nic = {n: sum(1 for m, _ in chosen if m == n) for n in nics}
        if any(c > (1 if distinct_nics else len(free_vfs[n])) for n, c in per_nic.items()):
            continue
        inside = sum(1 for n, g in chosen if g is not None and distances[(g, n)] <= limit)
        total = sum(distances[(g, n)] if g is not None else NO_GPU_COST for n, g in chosen)
        score = (len(chosen), inside, -total)
        best = score if best is None or score > best else best
    return best


@st.composite
def problems(draw):
    n_gpus, n_nics, n_rails = draw(st.integers(0, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    gpus = [f"g{i}" for i in range(n_gpus)]
    nics = [f"n{i}" for i in range(n_nics)]
    level = st.sampled_from(list(Distance))
    distances = {(g, n): draw(level) for g in gpus for n in nics}
    free = {n: [f"{n}v{j}" for j in range(draw(st.integers(0, 2)))] for n in nics}
    pools = st.one_of(st.none(), st.frozensets(st.sampled_from(nics)))
    rails = [Rail(f"r{i}", draw(pools)) for i in range(n_rails)]
    return rails, gpus, free, distances, draw(level), draw(st.booleans())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_matches_brute_force(problem):
    rails, gpus, free, distances, limit, distinct = problem
    got = pair_rails(rails, gpus, free, distances, limit=limit, distinct_nics=distinct)
    assert got.score == brute_force(rails, gpus, free, distances, limit, distinct)
    # The assignment itself is valid: pools, VFs of the right NIC, each GPU and VF once.
    assert {p.rail for p in got.pairings} | set(got.unserved) == {r.name for r in rails}
    pools = {r.name: r.nics for r in rails}
    for p in got.pairings:
        assert pools[p.rail] is None or p.nic in pools[p.rail]
        assert p.vf in free[p.nic]
        assert p.distance == (distances[(p.gpu, p.nic)] if p.gpu is not None else None)
    real_gpus = [p.gpu for p in got.pairings if p.gpu is not None]
    assert len(set(real_gpus)) == len(real_gpus) and len({p.vf for p in got.pairings}) == len(got.pairings)
    if distinct:
        assert len({p.nic for p in got.pairings}) == len(got.pairings)
    # One rail per ADD, told what is pending, ends up as good whenever every rail can be served.
    if got.unserved == ():
        one_by_one = sequential(rails, gpus, free, distances, limit=limit, distinct_nics=distinct)
        inside = sum(1 for p in one_by_one if p.distance is not None and p.distance <= limit)
        total = sum(int(p.distance) if p.distance is not None else NO_GPU_COST for p in one_by_one)
        assert (len(one_by_one), inside, -total) == got.score
