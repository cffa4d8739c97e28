"""The OpenFlow 1.4 client (tenantnet/plugin/system/openflow.py) against the lab's real
ovs-vswitchd, compared with what `ovs-ofctl` sees: bundles all-or-nothing, overlap detected,
deletes that touch only what they name, big multipart replies, missing targets, and what
makes a bundle cheap next to an `ovs-ofctl --bundle` exec (its times: bench/bench_batching.py).

Every rule here has a cookie under PREFIX/MASK (ours) or FOREIGN and an in_port of 40000 or
more, and is removed afterwards: nothing of other tests is touched."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tenantnet.plugin.system import openflow as of

PREFIX, MASK = 0x0F10_0000_0000_0000, 0xFFFF_0000_0000_0000
FOREIGN = 0x1234
PORT = 40000
FOREIGN_PORTS = (PORT + 2, PORT + 99)
_LINE = re.compile(r"cookie=(0x[0-9a-f]+).*?priority=(\d+),in_port=(\d+),dl_src=([0-9a-f:]+),"
                   r"dl_dst=([0-9a-f:]+) actions=output:(\d+)$")


def mac(n: int) -> str:
    return f"02:0f:10:00:{n >> 8 & 0xFF:02x}:{n & 0xFF:02x}"


def rule(n: int, dst: int | None = None, priority: int = 1) -> of.Rule:
    """Our rule number n: in on port PORT+n from mac(n) to mac(dst), out on PORT+dst."""
    d = n + 1 if dst is None else dst
    return of.Rule(cookie=PREFIX | n, priority=priority, in_port=PORT + n, eth_src=mac(n), eth_dst=mac(d),
                   output=PORT + d)


def strict(r: of.Rule) -> of.DeleteStrict:
    return of.DeleteStrict(r.cookie, r.priority, r.in_port, r.eth_src, r.eth_dst)


def ofctl(lab: Any, *words: str, stdin: str | None = None) -> str:
    """ovs-ofctl [--options] <command> <the lab bridge> [args]."""
    options = [w for w in words if w.startswith("--")]
    command, *args = [w for w in words if not w.startswith("--")]
    return subprocess.run(["ovs-ofctl", "-O", "OpenFlow14", "--no-names", *options, command, target(lab), *args],
                          input=stdin, capture_output=True, text=True, timeout=20, check=True).stdout


def target(lab: Any) -> str:
    return f"unix:{lab.root}/{lab.bridge}.mgmt"


def dumped(lab: Any, match: str = f"cookie={PREFIX:#x}/{MASK:#x}") -> list[str]:
    out = ofctl(lab, "--no-stats", "dump-flows", match)
    return [line.strip() for line in out.splitlines() if "cookie=" in line or "priority=" in line]


def as_rules(lines: list[str]) -> list[of.Rule]:
    rules = []
    for line in lines:
        m = _LINE.search(line)
        assert m, f"not of our shape: {line}"
        cookie, priority, in_port, src, dst, out = m.groups()
        rules.append(of.Rule(int(cookie, 16), int(priority), int(in_port), src, dst, int(out)))
    return sorted(rules, key=lambda r: r.cookie)


def mine(sw: of.Switch) -> list[of.Rule]:
    return sorted(sw.rules(PREFIX, MASK), key=lambda r: r.cookie)


@pytest.fixture
def sw(lab: Any) -> Iterator[of.Switch]:
    switch = of.Switch(target(lab), timeout=10)
    yield switch
    switch.close()
    ofctl(lab, "del-flows", f"cookie={PREFIX:#x}/{MASK:#x}")
    for port in FOREIGN_PORTS:  # this file's foreign rules (other tests' rules have other in_ports)
        ofctl(lab, "del-flows", f"cookie={FOREIGN:#x}/-1,in_port={port}")
    assert not dumped(lab) and not dumped(lab, f"cookie={FOREIGN:#x}/-1,in_port={PORT + 99}")


def test_bundle_then_rules_agree_with_dump_flows(lab: Any, sw: of.Switch) -> None:
    written = [rule(n, n ^ 1) for n in range(6)]  # three pairs, both ways
    sw.bundle([of.AddRule(r) for r in written])
    assert mine(sw) == sorted(written, key=lambda r: r.cookie)
    lines = dumped(lab)
    assert all("check_overlap" in line for line in lines)  # OFPFF_CHECK_OVERLAP went with them
    assert as_rules(lines) == mine(sw)  # same cookie, priority, match and actions as ovs-ofctl reads
    # rules() of a shape that is not ours: output 0, the fields there are
    ofctl(lab, "add-flow", f"cookie={PREFIX | 0xFF:#x},priority=3,in_port={PORT},dl_dst={mac(1)},"
                           f"actions=output:{PORT + 1},output:{PORT + 2}")
    assert of.Rule(PREFIX | 0xFF, 3, PORT, "", mac(1), 0) in sw.rules(PREFIX | 0xFF, (1 << 64) - 1)


def test_delete_strict_then_add_in_one_bundle_is_idempotent(lab: Any, sw: of.Switch) -> None:
    ops: list[of.Op] = [op for n in range(4) for op in (strict(rule(n)), of.AddRule(rule(n)))]
    for _ in range(3):
        sw.bundle(ops)
        assert mine(sw) == [rule(n) for n in range(4)]
    assert len(dumped(lab)) == 4


def test_foreign_overlap_fails_the_whole_bundle(lab: Any, sw: of.Switch) -> None:
    # Somebody else's rule at our priority that overlaps rule(2)'s match (no dl_src).
    ofctl(lab, "add-flow", f"cookie={FOREIGN:#x},priority=1,in_port={PORT + 2},dl_dst={mac(3)},actions=drop")
    before = dumped(lab, f"cookie={FOREIGN:#x}/-1")
    with pytest.raises(of.OpenflowError) as info:
        sw.bundle([of.AddRule(rule(0)), of.AddRule(rule(1)), strict(rule(2)), of.AddRule(rule(2)),
                   of.AddRule(rule(3))])
    assert info.value.overlap and (info.value.type, info.value.code) == (of.OFPET_FLOW_MOD_FAILED,
                                                                         of.OFPFMFC_OVERLAP)
    assert "OVERLAP for operation 4 of 5" in str(info.value) and "nothing was applied" in str(info.value)
    assert mine(sw) == [] and dumped(lab) == []  # not rule(0) or rule(1) either
    assert dumped(lab, f"cookie={FOREIGN:#x}/-1") == before
    sw.bundle([of.AddRule(rule(0)), of.AddRule(rule(1))])  # the connection still works
    assert mine(sw) == [rule(0), rule(1)]
    # Without check_overlap the switch takes it (and both rules stay: they differ in match).
    sw.bundle([of.AddRule(rule(2), check_overlap=False)])
    assert rule(2) in mine(sw) and dumped(lab, f"cookie={FOREIGN:#x}/-1") == before


def test_delete_by_cookie_mask_removes_only_ours(lab: Any, sw: of.Switch) -> None:
    ofctl(lab, "add-flow", f"cookie={FOREIGN:#x},priority=1,in_port={PORT + 99},dl_src={mac(0)},"
                           f"dl_dst={mac(1)},actions=output:{PORT + 1}")
    sw.bundle([of.AddRule(rule(n)) for n in range(5)])
    assert len(mine(sw)) == 5
    sw.delete(PREFIX, MASK)
    assert mine(sw) == [] and dumped(lab) == []  # gone when delete() returned (its barrier)
    assert len(dumped(lab, f"cookie={FOREIGN:#x}/-1")) == 1
    assert [r.cookie for r in sw.rules(FOREIGN, (1 << 64) - 1)] == [FOREIGN]
    sw.bundle([of.AddRule(rule(n)) for n in range(3)])
    sw.delete(PREFIX | 1, (1 << 64) - 1)  # one cookie exactly
    assert mine(sw) == [rule(0), rule(2)]


def test_delete_with_eth_dst_removes_only_rules_to_it(lab: Any, sw: of.Switch) -> None:
    ofctl(lab, "add-flow", f"cookie={FOREIGN:#x},priority=1,in_port={PORT + 99},dl_src={mac(50)},"
                           f"dl_dst={mac(9)},actions=output:{PORT + 9}")
    to_nine = [rule(n, 9) for n in range(4)]
    to_eight = [rule(n, 8) for n in range(4, 7)]
    from_nine = rule(9, 8)
    sw.bundle([of.AddRule(r) for r in [*to_nine, *to_eight, from_nine]])
    sw.delete(PREFIX, MASK, eth_dst=mac(9))
    assert mine(sw) == sorted([*to_eight, from_nine], key=lambda r: r.cookie)  # from mac(9) stays
    assert len(dumped(lab, f"cookie={FOREIGN:#x}/-1")) == 1


def test_many_rules_come_in_several_multipart_replies(lab: Any, sw: of.Switch) -> None:
    count = 1500  # ≈ 104 bytes each: OVS starts a new reply (REPLY_MORE) every 64 KiB
    written = [rule(n, n + 2000) for n in range(count)]
    sw.bundle([of.AddRule(r) for r in written])
    replies = []
    receive = sw._receive

    def counting(sock: Any, deadline: float) -> of.Message:
        m = receive(sock, deadline)
        if m.type == of.OFPT_MULTIPART_REPLY:
            replies.append(m)
        return m

    sw._receive = counting  # type: ignore[method-assign]
    assert mine(sw) == written
    assert len(replies) >= 2 and replies[0].body[3] & of.OFPMPF_REPLY_MORE
    assert not replies[-1].body[3] & of.OFPMPF_REPLY_MORE
    assert len(dumped(lab)) == count
    sw.delete(PREFIX, MASK)
    assert mine(sw) == []


def test_threads_share_a_switch(lab: Any, sw: of.Switch) -> None:
    errors: list[BaseException] = []

    def work(base: int) -> None:
        try:
            for i in range(25):
                r = rule(base + i % 5)
                sw.bundle([strict(r), of.AddRule(r)])
                assert r in sw.rules(r.cookie, (1 << 64) - 1)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t * 10,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(mine(sw)) == 20


def test_bridge_name_target_uses_ovs_rundir(lab: Any, sw: of.Switch, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVS_RUNDIR", str(lab.root))
    with of.Switch(lab.bridge, timeout=5) as by_name:
        by_name.bundle([of.AddRule(rule(0))])
    assert mine(sw) == [rule(0)]


def test_missing_target_fails_clearly_and_quickly(lab: Any) -> None:
    started = time.monotonic()
    with pytest.raises(of.OpenflowError) as info:
        of.Switch(f"unix:{lab.root}/br-nowhere.mgmt", timeout=60).bundle([of.AddRule(rule(0))])
    # The missing socket is refused at once; retrying until the time-out would take 60 s:
    # under 20 s separates the two on any load.
    assert time.monotonic() - started < 20
    text = str(info.value)
    assert "cannot connect to unix:" in text and "br-nowhere.mgmt" in text and "does the bridge exist" in text
    assert not info.value.overlap and info.value.type is None


def test_a_kept_switch_bundles_without_reconnecting(lab: Any, sw: of.Switch,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Pre-warm's write for one pair: two rules, each after its strict delete. What makes it
    cheap next to an `ovs-ofctl --bundle` exec (an exec, a connection and a handshake each
    time) is counted here: on a kept Switch, no new connection and two writes per bundle (open +
    flow_mods + barrier, then the commit). The times are a figure of `make bench`
    (bench/bench_batching.py), not a pass/fail bound."""
    a, b = rule(0, 1), rule(1, 0)
    ops: list[of.Op] = [strict(a), of.AddRule(a), strict(b), of.AddRule(b)]
    sw.bundle(ops)  # connected
    connects: list[bool] = []  # per call of _connect: whether it opened a new connection
    sends: list[int] = []
    real_connect, real_send = sw._connect, sw._send
    monkeypatch.setattr(sw, "_connect", lambda *args: (connects.append(sw._sock is None), real_connect(*args))[1])
    monkeypatch.setattr(sw, "_send", lambda sock, deadline, data, first=False:
                        (sends.append(len(data)), real_send(sock, deadline, data, first))[1])
    for _ in range(50):
        sw.bundle(ops)
    assert connects == [False] * 50 and len(sends) == 2 * 50, (connects, sends)
    assert mine(sw) == [a, b]
