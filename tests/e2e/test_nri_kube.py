"""tenantnet's NRI plugin (tenantnet/kube/nri.py) against the real containerd v2.3.4 of the
session's Kubernetes lab: the independent oracle of its multiplexer, ttrpc framing and start
sequence (tests/unit/test_nri.py checks them only against a fake of our own reading).

The plugin runs in the test process on the lab containerd's NRI socket
(`<lab>/containerd/nri/nri.sock`, tenantnet/lab/kubeconf.py) with a recording handler. A pod
scheduled for real reaches run_pod_sandbox with its UID, name, namespace and the path of the
network namespace its containers then live in (same inode); a plugin connecting
while it runs finds it in Synchronize; deleting it reaches stop_pod_sandbox for the same
sandbox. A handler raising NriRefusal makes the pod's sandbox fail to start (stop and remove
relayed for it): the kubelet's event carries our message; a handler
that outlasts containerd's request timeout is dropped and the pod runs (containerd's rule),
the plugin reconnecting and finding the pod in Synchronize. The plugin is
stopped and the namespace deleted at the end, also on failure: the lab is as it was.
Fails (never skips) without the Kubernetes binaries, as tests/e2e/test_kube_lab.py.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tenantnet.kube import nri
from tenantnet.lab import kube, kubeconf, kubeimages
from tests.e2e.test_kube_lab import Lab, klab  # noqa: F401  (the session's lab, tests/e2e/conftest.py)
from tests.polling import poll

NAMESPACE = "nri-e2e"
REFUSED = "nri-refused"
REFUSAL = "tenantnet e2e: rails for this pod are not ready (a test refusal)"


class Recorder:
    """Records every call; refuses run_pod_sandbox for the pod named REFUSED. The netns is
    looked at during the call: it must exist then, when the agent would move VFs into it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, nri.PodSandbox, int]] = []  # (what, pod, netns inode or 0)
        self.holds: dict[str, threading.Event] = {}  # pod name -> run_pod_sandbox waits for it

    def _record(self, what: str, pod: nri.PodSandbox) -> None:
        try:
            inode = os.stat(pod.netns).st_ino if pod.netns else 0
        except OSError:
            inode = 0
        with self.lock:
            self.calls.append((what, pod, inode))

    def synchronize(self, pods: list[nri.PodSandbox]) -> None:
        for pod in pods:
            self._record("synchronize", pod)

    def run_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        self._record("run", pod)
        hold = self.holds.get(pod.name) if pod.namespace == NAMESPACE else None
        if hold is not None:
            hold.wait(300)
        if pod.namespace == NAMESPACE and pod.name == REFUSED:
            raise nri.NriRefusal(REFUSAL)

    def stop_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        self._record("stop", pod)

    def remove_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        self._record("remove", pod)

    def of(self, what: str, name: str) -> list[tuple[nri.PodSandbox, int]]:
        with self.lock:
            return [(p, i) for w, p, i in self.calls if w == what and p.namespace == NAMESPACE and p.name == name]


def _pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                "name": "main", "image": kubeimages.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "exec sleep 3600"]}]}}


@pytest.fixture(scope="module")
def plugged(klab: Lab) -> Iterator[tuple[Lab, Recorder, nri.NriPlugin]]:  # noqa: F811
    socket_path = kubeconf.LabPaths(klab.lab.root).containerd / "nri" / "nri.sock"
    assert socket_path.is_socket(), f"the lab's containerd serves no NRI socket at {socket_path}"
    handler = Recorder()
    plugin = nri.NriPlugin(str(socket_path), handler, name="tenantnet-e2e", index="50")
    plugin.start()
    try:
        assert poll(lambda: plugin.connected, 30, 0.1), \
            "the plugin did not register with the lab's containerd:\n" + klab.diagnostics()
        kube.apply(klab.lab, json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))
        yield klab, handler, plugin
    finally:
        try:
            # Not waited for: the namespace is this module's alone, and its deletion (the
            # namespace controller's) takes ~20 s for nothing anyone waits on.
            klab.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", timeout=150)
        finally:
            plugin.stop()


def _events(lab: Lab, name: str) -> list[dict[str, Any]]:
    got = json.loads(lab.kubectl("get", "events", "-n", NAMESPACE, "--field-selector",
                                 f"involvedObject.name={name}", "-o", "json"))
    return list(got["items"])


def test_a_pod_reaches_the_handler_with_its_identity_and_netns(plugged: Any) -> None:
    lab, handler, plugin = plugged
    kube.apply(lab.lab, json.dumps(_pod("nri-ok")))
    lab.kubectl("wait", "-n", NAMESPACE, "--for=condition=Ready", "pod/nri-ok", "--timeout=180s", timeout=200)
    meta = json.loads(lab.kubectl("get", "pod", "-n", NAMESPACE, "nri-ok", "-o", "json"))["metadata"]

    runs = handler.of("run", "nri-ok")
    assert len(runs) == 1, handler.calls
    pod, inode = runs[0]
    assert (pod.uid, pod.name, pod.namespace) == (meta["uid"], "nri-ok", NAMESPACE)
    assert pod.id and pod.netns and inode, f"no network namespace at the call: {pod}"
    # the netns handed to us is the one the pod's container lives in
    seen = lab.kubectl("exec", "-n", NAMESPACE, "nri-ok", "--", "ls", "-l", "/proc/self/ns/net").strip()
    assert seen.endswith(f"-> net:[{inode}]") and os.stat(pod.netns).st_ino == inode, (seen, pod.netns, inode)

    # a plugin connecting now (the agent restarted) finds the running pod in Synchronize
    late = Recorder()
    second = nri.NriPlugin(plugin.socket_path, late, name="tenantnet-e2e-late", index="51")
    second.start()
    try:
        assert poll(lambda: second.connected, 30, 0.1), "the second plugin did not register"
        assert late.of("synchronize", "nri-ok") == [(pod, inode)], late.calls
    finally:
        second.stop()

    lab.kubectl("delete", "pod", "-n", NAMESPACE, "nri-ok", "--wait=true", "--timeout=120s", timeout=150)
    # StopPodSandbox comes with the pod's deletion; RemovePodSandbox only when the kubelet's
    # garbage collection of dead sandboxes runs (about a minute later), which is not waited for
    # here (the dispatch of remove is tests/unit/test_nri.py's).
    assert poll(lambda: handler.of("stop", "nri-ok"), 60, 0.2), handler.calls
    stops, removes = handler.of("stop", "nri-ok"), handler.of("remove", "nri-ok")
    assert {p.id for p, _ in stops + removes} == {pod.id}
    assert plugin.connected


def test_a_refusal_fails_the_pod_sandbox_with_our_message(plugged: Any) -> None:
    lab, handler, plugin = plugged
    kube.apply(lab.lab, json.dumps(_pod(REFUSED)))
    try:
        def refused_event() -> bool:
            return any(e.get("reason") == "FailedCreatePodSandBox" and REFUSAL in e.get("message", "")
                       for e in _events(lab, REFUSED))

        assert poll(refused_event, 120, 0.5), f"no FailedCreatePodSandBox with our message: {_events(lab, REFUSED)}"
        status = json.loads(lab.kubectl("get", "pod", "-n", NAMESPACE, REFUSED, "-o", "json"))["status"]
        assert status.get("phase") == "Pending", status
        assert not any(c.get("state", {}).get("running") for c in status.get("containerStatuses", []))
        runs = handler.of("run", REFUSED)
        assert runs, handler.calls
        # containerd relays stop and remove for the sandbox it gave up
        refused_ids = {p.id for p, _ in runs}
        assert poll(lambda: {p.id for p, _ in handler.of("remove", REFUSED)} & refused_ids, 30, 0.2)
        message = next(e["message"] for e in _events(lab, REFUSED) if REFUSAL in e.get("message", ""))
        assert "NRI RunPodSandbox failed" in message, message
    finally:
        lab.kubectl("delete", "pod", "-n", NAMESPACE, REFUSED, "--ignore-not-found", "--wait=true",
                    "--timeout=120s", timeout=150)
    assert plugin.connected


def test_a_handler_past_the_request_timeout_is_dropped_and_the_pod_runs_without_it(plugged: Any) -> None:
    """containerd's own rule (nri pkg/adaptation/plugin.go: a deadline is "fatal", the plugin is
    closed and the call succeeds): a run_pod_sandbox that does not answer within the request
    timeout (2 s by default; the lab's containerd has 15 s, tenantnet/lab/kubeconf.py, for
    DRA's VF moves: most of this test's time, waited out) does not hold the pod back. Shown without a clock: the handler
    waits until the pod is Ready. The plugin then reconnects and finds the pod in Synchronize:
    the place where the agent must catch such a pod up."""
    lab, handler, plugin = plugged
    before = plugin.connections
    handler.holds["nri-slow"] = hold = threading.Event()
    try:
        kube.apply(lab.lab, json.dumps(_pod("nri-slow")))
        lab.kubectl("wait", "-n", NAMESPACE, "--for=condition=Ready", "pod/nri-slow", "--timeout=180s", timeout=200)
        assert handler.of("run", "nri-slow"), handler.calls  # it was asked, and is still busy
        hold.set()
        assert poll(lambda: plugin.connections > before and plugin.connected, 60, 0.2), "no reconnection"
        assert handler.of("synchronize", "nri-slow"), handler.calls
    finally:
        hold.set()
        lab.kubectl("delete", "pod", "-n", NAMESPACE, "nri-slow", "--ignore-not-found", "--wait=true",
                    "--timeout=120s", timeout=150)
