"""The agent's in-flight count: a request leaves it before its answer is sent."""
import socket
import time
from types import SimpleNamespace

import pytest

from tenantnet.entry import shim
from tenantnet.entry.agent import STATUS_OP, Agent


@pytest.mark.parametrize("request_", ["status", "unknown plugin", "unreadable"])
def test_a_request_leaves_the_count_before_its_answer_is_sent(tmp_path, monkeypatch, request_):
    # A caller that has its answer may call again at once (the runtime's next CNI call); at
    # the limit it must not be refused as busy by its own finished request. Counted until
    # after the send, a back-to-back call was refused now and then (CI, a loaded machine).
    agent = Agent(str(tmp_path / "agent.sock"), str(tmp_path / "node.yaml"), max_inflight=1)
    logged: list[str] = []
    agent.log = SimpleNamespace(warning=lambda event, **_: logged.append(event))  # not started
    counted_at_send = []
    real_send = shim.frame

    def frame(payload: bytes) -> bytes:
        counted_at_send.append(agent.stats.inflight)
        return real_send(payload)

    monkeypatch.setattr(shim, "frame", frame)
    served, caller = socket.socketpair()
    with served, caller:
        if request_ == "unreadable":
            caller.sendall(real_send(b"a request cut short")[:9])  # then the caller gives up
            caller.shutdown(socket.SHUT_WR)
        else:
            plugin = STATUS_OP if request_ == "status" else "no-such-plugin"
            caller.sendall(real_send(shim.encode_request(plugin, {}, b"{}", time.monotonic() + 5)))
        agent.stats.inflight = 1  # as admission counted it
        agent._serve(served)
        assert agent.stats.inflight == 0
        if request_ == "unreadable":
            assert counted_at_send == [] and caller.recv(1) == b""  # closed unanswered
            assert logged == ["request.unreadable"] and agent.stats.protocol_errors == 1
            return
        assert counted_at_send == [0], counted_at_send
        code, out, _ = shim.decode_response(shim.recv_frame(caller))
    if request_ == "status":
        assert code == 0 and b'"inflight"' in out
    else:
        assert code == 1 and b"unknown plugin" in out
