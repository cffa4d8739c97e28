"""Network config decoding: the shared CNI part and tenantnet's own fields."""

from __future__ import annotations

import json

import pytest

from cni.env import parse_env
from cni.errors import CniError
from cni.netconf import ci_get, decode_json, parse_netconf, valid_attachments
from tenantnet.plugin import tnconf as tn
from tenantnet.plugin.nodeconfig import NodeConfig

ENV = parse_env({"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/x",
                 "CNI_IFNAME": "net1", "CNI_ARGS": "IgnoreUnknown=1;MAC=02:00:00:00:00:02"})


def conf(**kw):
    base = {"cniVersion": "1.0.0", "name": "n1", "type": "tenantnet", "bridge": "br0"}
    base.update(kw)
    return parse_netconf({k: v for k, v in base.items() if v is not None})


def test_unknown_keys_ignored_and_args_cni_read():
    c = conf(somethingNew={"x": 1}, args={"cni": {"ips": ["10.0.0.2/24"]}})
    assert c.args_cni == {"ips": ["10.0.0.2/24"]}


def test_runtime_config_case_insensitive():
    c = conf(runtimeConfig={"Mac": "02:00:00:00:00:01", "portMappings": [{"ContainerPort": 80}]})
    assert c.runtime("mac") == "02:00:00:00:00:01"
    assert ci_get(c.runtime("portmappings")[0], "containerPort") == 80


def test_decode_errors():
    with pytest.raises(CniError) as err:
        decode_json(b"\xff\xfe")
    assert err.value.code == 6
    with pytest.raises(CniError) as err:
        decode_json("null")
    assert err.value.code == 6 and "NoneType" in err.value.msg


def test_valid_attachments_both_keys():
    assert valid_attachments({"cni.dev/valid-attachments": [{"containerID": "a", "ifname": "n"}]}) == {("a", "n")}
    assert valid_attachments({"cni.dev/attachments": [{"containerID": "b", "ifname": "m"}]}) == {("b", "m")}
    assert valid_attachments({}) == set()
    with pytest.raises(CniError):
        valid_attachments({"cni.dev/valid-attachments": [{"ifname": "x"}]})


@pytest.mark.parametrize("raw,mode", [
    ({"bridge": "br0"}, "ovs"),
    ({"bridge": None, "deviceID": "0000:03:00.2"}, "sriov"),
    ({"bridge": None, "pciBusID": "0000:03:00.2"}, "sriov"),
    ({"bridge": None, "pf": "ens1f0"}, "sriov"),
    ({"bridge": "br0", "deviceID": "0000:03:00.2"}, "ovs-offload"),
    ({"mode": "ovs"}, "ovs"),
])
def test_mode_inference(raw, mode):
    base = {"bridge": "br0", **raw}
    assert tn.infer_mode({k: v for k, v in base.items() if v is not None}) == mode


def test_ovs_fields_with_ovs_cni_meaning():
    t = tn.parse(conf(vlan=0, trunk=[{"id": 7}, {"minID": 10, "maxID": 12}, {"id": 11}], mtu=9000,
                      ofport_request=20, socket_file="/run/ovs/db.sock"), ENV,
                 NodeConfig(ovsdb_endpoints=("unix:/run/ovs/db.sock",)))
    assert t.mode == "ovs" and t.ovs is not None
    assert t.ovs.vlan == 0 and t.ovs.trunks == (7, 10, 11, 12)
    assert t.ovs.mtu == 9000 and t.ovs.ofport_request == 20
    assert t.ovs.ovsdb == "unix:/run/ovs/db.sock"


def test_ovsdb_endpoint_defaults_to_node_config(tmp_path):
    node = NodeConfig(ovsdb="tcp:127.0.0.1:6640", ovsdb_endpoints=("unix:/elsewhere.sock",),
                      ovs_configuration_paths=(str(tmp_path),))
    assert tn.parse(conf(), ENV, node).ovs.ovsdb == "tcp:127.0.0.1:6640"
    flat = tmp_path / "ovs.json"
    flat.write_text(json.dumps({"socket_file": "unix:/elsewhere.sock"}))
    assert tn.parse(conf(configuration_path=str(flat)), ENV, node).ovs.ovsdb == "unix:/elsewhere.sock"
    # an endpoint the node config does not list is refused, from the NAD or from the file
    flat.write_text(json.dumps({"socket_file": "unix:/other.sock"}))
    with pytest.raises(CniError) as err:
        tn.parse(conf(configuration_path=str(flat)), ENV, node)
    assert err.value.code == 7 and "ovsdbEndpoints" in err.value.msg
    with pytest.raises(CniError) as err:
        tn.parse(conf(socket_file="unix:/other.sock"), ENV, node)
    assert "socket_file='unix:/other.sock'" in err.value.msg


def test_mac_precedence_runtime_then_cni_args_then_conf():
    assert tn.parse(conf(mac="02:00:00:00:00:03"), ENV, NodeConfig()).mac == "02:00:00:00:00:02"
    c = conf(mac="02:00:00:00:00:03", runtimeConfig={"mac": "02:00:00:00:00:01"})
    assert tn.parse(c, ENV, NodeConfig()).mac == "02:00:00:00:00:01"
    plain = parse_env({"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/x", "CNI_IFNAME": "e"})
    assert tn.parse(conf(mac="02:00:00:00:00:03"), plain, NodeConfig()).mac == "02:00:00:00:00:03"


@pytest.mark.parametrize("kw,code,needle", [
    ({"vlan": 4095}, 7, "vlan=4095"),
    ({"vlan": True}, 7, "vlan=True"),
    ({"trunk": [{"minID": 5}]}, 7, "trunk[0]"),
    ({"trunk": [{"minID": 5, "maxID": 4095}]}, 7, "trunk[0].maxID=4095"),
    ({"mtu": 70000}, 7, "mtu=70000"),
    ({"ofport_request": 65280}, 7, "ofport_request=65280"),
    ({"bridge": ""}, 7, "cannot infer mode"),
    ({"bridge": "x" * 64}, 7, "bridge="),
    ({"interface_type": "internal"}, 2, "interface_type='internal'"),
    ({"socket_file": "tcp:host"}, 7, "socket_file='tcp:host'"),
    ({"configuration_path": "relative.json"}, 7, "configuration_path"),
    ({"configuration_path": "/nonexistent/ovs.json"}, 7, "allowed directories"),
    ({"configuration_path": "/etc/kubernetes/cni/net.d/ovs.d/../../../../shadow"}, 7, "plain path"),
    ({"trunk": [{"id": 5, "minID": 1, "maxID": 9}]}, 7, "not both"),
    ({"bridge": "br0\n"}, 7, "bridge="),
    ({"logFile": "/etc/evil.log"}, 7, "logFile='/etc/evil.log'"),
    ({"logFile": "/var/log/tenantnet/sub/x.log"}, 7, "directly in the node's log directory"),
    ({"runtimeConfig": {"dns": {"servers": "x"}}}, 7, "runtimeConfig.dns.servers='x'"),
    ({"runtimeConfig": {"ips": "10.0.0.1"}}, 7, "runtimeConfig.ips"),
    ({"runtimeConfig": {"mac": 5}}, 7, "runtimeConfig.mac=5"),
    ({"ipam": {"type": "tenantnet"}}, 7, "names tenantnet itself"),
    ({"ipam": {"type": "host-local", "dataDir": "/etc"}}, 7, "ipam.dataDir='/etc'"),
    ({"ipam": {"type": "host-local", "resolvConf": "/etc/shadow"}}, 7, "ipam.resolvConf='/etc/shadow'"),
    ({"link_state_check_retries": -1}, 7, "link_state_check_retries=-1"),
    ({"logLevel": "loud"}, 7, "logLevel='loud'"),
    ({"mode": "ovs-offload"}, 7, "needs deviceID"),
    ({"offloadCheck": "yes"}, 7, "offloadCheck='yes'"),
])
def test_bad_ovs_fields(kw, code, needle):
    with pytest.raises(CniError) as err:
        tn.parse(conf(**kw), ENV, NodeConfig())
    assert err.value.code == code and needle in err.value.msg


def test_every_mode_has_a_driver():
    from tenantnet.plugin.modes import for_mode

    assert [for_mode(m, NodeConfig()).mode for m in tn.MODES] == list(tn.MODES)
    with pytest.raises(CniError):
        tn.infer_mode({"mode": "vxlan"})


def test_host_ifname_is_deterministic_and_short():
    from tenantnet.plugin.drivers.ovs import host_ifname

    a = host_ifname("c" * 64, "net1")
    assert a == host_ifname("c" * 64, "net1") and len(a) <= 15 and a.startswith("tn")
    assert a != host_ifname("c" * 64, "net2") and a != host_ifname("d" * 64, "net1")
