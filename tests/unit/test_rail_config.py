"""The rail fields of a network config (railAlignment, rdma) and of the node config
(podResourcesSocket, gpuResourceNames, nvidiaProcRoot, gpuMap, rdmaControl): defaults, and
every bad value named with what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cni.errors import CniError
from cni.netconf import parse_netconf
from tenantnet.plugin import nodeconfig
from tenantnet.plugin.tnconf import _vf_settings


def vf(**kw: Any) -> Any:
    return _vf_settings(parse_netconf({"cniVersion": "1.0.0", "name": "rail", "type": "tenantnet",
                                       "mode": "sriov", "pf": "ens1f0", **kw}))


def test_rail_fields_default_to_off_and_auto() -> None:
    v = vf()
    assert (v.rail_within, v.rail_action, v.rdma) == (None, "warn", "auto")
    v = vf(railAlignment={}, rdma="exclusive")
    assert (v.rail_within, v.rail_action, v.rdma) == ("PIX", "warn", "exclusive")
    assert vf(railAlignment={"within": "NODE", "action": "refuse"}).rail_within == "NODE"


@pytest.mark.parametrize("field,value,needle", [
    ("railAlignment", "PIX", "railAlignment='PIX'"),
    ("railAlignment", {"within": "SYS"}, "railAlignment.within='SYS'"),
    ("railAlignment", {"action": "ignore"}, "railAlignment.action='ignore'"),
    ("railAlignment", {"near": "PIX"}, "railAlignment.near"),
    ("rdma", "on", "rdma='on'"),
])
def test_bad_rail_fields_are_named(field: str, value: Any, needle: str) -> None:
    with pytest.raises(CniError) as err:
        vf(**{field: value})
    assert err.value.code == 7 and needle in err.value.msg, err.value.msg


def node(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "node.yaml"
    path.write_text(text)
    return nodeconfig.load(str(path))


def test_node_config_rail_keys(tmp_path: Path) -> None:
    n = node(tmp_path, "{}\n")
    assert (n.pod_resources_socket, n.gpu_resource_names, n.nvidia_proc_root, n.gpu_map, n.rdma_control) == \
        ("/var/lib/kubelet/pod-resources/kubelet.sock", ("nvidia.com/gpu",), "/proc", None, "netlink")
    n = node(tmp_path, "podResourcesSocket: /run/k.sock\ngpuResourceNames: [amd.com/gpu]\n"
                       "gpuMap: {GPU-1: 1b:00.0}\nrdmaControl: lab-rdma:/lab\n")
    assert n.gpu_map == {"GPU-1": "0000:1b:00.0"} and n.gpu_resource_names == ("amd.com/gpu",)
    for bad, key in (("gpuResourceNames: [gpu]\n", "gpuResourceNames"), ("gpuMap: {GPU-1: nowhere}\n", "gpuMap"),
                     ("podResourcesSocket: relative.sock\n", "podResourcesSocket"),
                     ("rdmaControl: magic\n", "rdmaControl")):
        with pytest.raises(CniError) as err:
            node(tmp_path, bad)
        assert key in err.value.msg, err.value.msg


def test_rdma_mode_that_cannot_be_read_warns_under_auto_and_refuses_under_exclusive() -> None:
    from dataclasses import replace

    from tenantnet.plugin.drivers.vf import VfDriver
    from tenantnet.plugin.system.rdmacontrol import RdmaUnavailable
    from tenantnet.plugin.system.sysfs import VirtualFunction

    class Unreadable:
        def netns_mode(self) -> str:
            raise RdmaUnavailable("no RDMA netlink in this kernel (ib_core not loaded)")

    driver = VfDriver(nodeconfig.NodeConfig())
    driver._rdma_control = Unreadable()  # type: ignore[assignment]
    fn = VirtualFunction("0000:3b:00.2", "0000:3b:00.0", "ens1f0", 0, "mlx5_core", "ens1f0v0", 0, "mlx5_2")
    conf = type("Conf", (), {"vf": vf(), "name": "rail"})()
    assert driver._rdma_isolated(conf, fn) is False  # auto: warned, the netdev alone
    conf.vf = replace(vf(), rdma="exclusive")
    with pytest.raises(CniError) as err:
        driver._rdma_isolated(conf, fn)
    assert err.value.code == 106 and "cannot be read" in err.value.msg
    assert driver._rdma_isolated(conf, replace(fn, rdma_device=None)) is False  # nothing to isolate
