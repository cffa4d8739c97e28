"""DRA claim records as the CNI path sees them (tenantnet/plugin/draclaims.py): Multus's DRA
path names a claim's device by its CDI name, which binds to the VF only for the pod the
claim is reserved for, in its namespace, on its network, with `attach: cni`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cni.env import CniArgs, CniEnv
from cni.errors import CniError, Code
from cni.netconf import parse_netconf
from tenantnet.plugin import draclaims
from tenantnet.plugin.draclaims import ClaimDevice, ClaimRecord, ClaimStore

UID = "0b6d7c2e-1f0a-4c1e-9a53-2d2f1e0c9b11"
POD_UID = "5f1c0d0e-0000-4000-8000-000000000001"


def _record(attach: str = "cni") -> ClaimRecord:
    return ClaimRecord(uid=UID, namespace="tenant-a", name="rails", network="rail-1", tenant="a",
                       attach=attach, pod_uid=POD_UID, pod_name="trainer",
                       devices=[ClaimDevice(request="rail", device="vf-0000-1b-00-2", vf="0000:1b:00.2",
                                            ifname="rail")])


def _env(namespace: str = "tenant-a", pod_uid: str = POD_UID) -> CniEnv:
    return CniEnv(command="ADD", container_id="c" * 64, netns="/var/run/netns/x", ifname="net1",
                  path=(), args=CniArgs(pod_namespace=namespace, pod_name="trainer", pod_uid=pod_uid))


def _conf(**fields: object) -> object:
    return parse_netconf({"cniVersion": "1.0.0", "name": "rail-1", "type": "tenantnet",
                          "tenantNetwork": "rail-1", **fields})


@pytest.fixture
def state(tmp_path: Path) -> str:
    ClaimStore(str(tmp_path)).save(_record())
    return str(tmp_path)


def test_device_names_round_trip() -> None:
    assert draclaims.device_name("0000:1B:00.2") == "vf-0000-1b-00-2"
    assert draclaims.vf_of_device("vf-0000-1b-00-2") == "0000:1b:00.2"
    assert draclaims.vf_of_device("gpu-0") is None
    assert draclaims.vf_of_device("vf-0000-1b-00-9") is None  # a PCI function is 0-7


def test_record_round_trips_and_is_found_by_vf(state: str) -> None:
    rec = ClaimStore(state).load(UID)
    assert rec == _record()
    assert set(draclaims.claimed_vfs(state)) == {"0000:1b:00.2"}
    assert rec is not None and rec.cdi_id(rec.devices[0]) == f"tenantnet.io/vf=claim-{UID}-vf-0000-1b-00-2"


def test_store_refuses_a_uid_that_is_not_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        ClaimStore(str(tmp_path)).path("../../etc/passwd")


@pytest.mark.parametrize("field", ["deviceID", "pciBusID"])
def test_cdi_name_binds_to_the_vf_for_the_claims_pod(state: str, field: str) -> None:
    for value in (f"claim-{UID}-vf-0000-1b-00-2", f"tenantnet.io/vf=claim-{UID}-vf-0000-1b-00-2"):
        bound = draclaims.bind(_conf(**{field: value}), _env(), state)
        assert bound.raw[field] == "0000:1b:00.2"


def test_runtime_config_device_id_binds_too(state: str) -> None:
    bound = draclaims.bind(_conf(runtimeConfig={"deviceID": f"claim-{UID}-vf-0000-1b-00-2"}), _env(), state)
    assert bound.runtime("deviceID") == "0000:1b:00.2"


def test_a_pci_address_is_left_alone(state: str) -> None:
    conf = _conf(deviceID="0000:1b:00.2")
    assert draclaims.bind(conf, _env(), state) is conf


@pytest.mark.parametrize(("env", "conf", "code", "words"), [
    (_env(namespace="tenant-b"), {}, Code.TENANT_DENIED, "namespace tenant-b"),
    (_env(pod_uid="5f1c0d0e-0000-4000-8000-000000000002"), {}, Code.TENANT_DENIED, "not this pod"),
    (_env(pod_uid=""), {}, Code.TENANT_DENIED, "K8S_POD_UID"),
    (_env(), {"name": "rail-2", "tenantNetwork": "rail-2"}, Code.TENANT_DENIED, "prepared for TenantNetwork rail-1"),
])
def test_a_foreign_pod_or_network_is_refused(state: str, env: CniEnv, conf: dict[str, str], code: int,
                                             words: str) -> None:
    with pytest.raises(CniError) as err:
        draclaims.bind(_conf(**{"deviceID": f"claim-{UID}-vf-0000-1b-00-2", **conf}), env, state)
    assert err.value.code == code and words in err.value.msg


def test_an_unknown_claim_device_is_refused_by_name(state: str) -> None:
    other = "0b6d7c2e-1f0a-4c1e-9a53-2d2f1e0c9b12"
    for value in (f"claim-{other}-vf-0000-1b-00-2", f"claim-{UID}-vf-0000-1b-00-3"):
        with pytest.raises(CniError) as err:
            draclaims.bind(_conf(deviceID=value), _env(), state)
        assert err.value.code == Code.INVALID_CONFIG and value in err.value.msg


def test_a_claim_attached_at_the_pods_start_is_not_multus_s(tmp_path: Path) -> None:
    ClaimStore(str(tmp_path)).save(_record(attach="nri"))
    with pytest.raises(CniError) as err:
        draclaims.bind(_conf(deviceID=f"claim-{UID}-vf-0000-1b-00-2"), _env(), str(tmp_path))
    assert err.value.code == Code.INVALID_CONFIG and "attach: cni" in err.value.msg


def test_a_huge_record_is_not_read_whole(tmp_path: Path) -> None:
    store = ClaimStore(str(tmp_path))
    Path(store.root).mkdir(parents=True)
    Path(store.path(UID)).write_text(json.dumps({"pad": "x" * (draclaims.MAX_RECORD_BYTES + 10)}))
    with pytest.raises(ValueError):
        store.load(UID)
    assert list(store.all()) == []  # skipped, not fatal
