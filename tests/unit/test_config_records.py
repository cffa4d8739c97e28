"""Node config loading and the attachment record store."""

from __future__ import annotations

import json
import os
import stat

import pytest

from cni.errors import CniError
from tenantnet.plugin import nodeconfig as config
from tenantnet.plugin.drivers.ovs import OvsPlan
from tenantnet.plugin.modes import plan_type
from tenantnet.plugin.records import AttachmentRecord, CorruptRecord, PodRef, RecordStore


def test_missing_node_config_means_defaults(tmp_path):
    node = config.load(str(tmp_path / "absent.yaml"))
    assert node.ovsdb == "unix:/var/run/openvswitch/db.sock" and node.state_dir == "/var/lib/tenantnet"


def test_node_config_values(tmp_path):
    p = tmp_path / "n.yaml"
    p.write_text("ovsdb: /run/x/db.sock\nstateDir: /srv/tn\nlogFile: /srv/tn.log\nlogLevel: debug\n"
                 "ovsdbTimeout: 2\novsWait: true\n")
    node = config.load(str(p))
    assert (node.ovsdb, node.state_dir, node.log_level, node.ovsdb_timeout, node.ovs_wait) == \
        ("unix:/run/x/db.sock", "/srv/tn", "debug", 2.0, True)
    assert config.load(str(tmp_path / "absent.yaml")).ovs_wait is False


def test_node_config_from_environment(tmp_path, monkeypatch):
    p = tmp_path / "n.yaml"
    p.write_text("stateDir: /srv/elsewhere\n")
    monkeypatch.setenv("TENANTNET_CONFIG", str(p))
    assert config.load().state_dir == "/srv/elsewhere"


@pytest.mark.parametrize("text,needle", [
    ("ovsdb: [1]\n", "ovsdb=[1]"),
    ("ovsdb: ftp:x\n", "ovsdb='ftp:x'"),
    ("stateDir: relative\n", "stateDir='relative'"),
    ("logLevel: chatty\n", "logLevel='chatty'"),
    ("ovsdbTimeout: 0\n", "ovsdbTimeout=0"),
    ("ovsWait: yes please\n", "ovsWait='yes please': true or false"),
    ("ovsdbTimeout: true\n", "ovsdbTimeout=True"),
    ("statedir: /x\n", "unknown key 'statedir'"),
    ("- a list\n", "must be a YAML mapping"),
    ("a: [unclosed\n", "not valid YAML"),
])
def test_invalid_node_config_names_file_and_key(tmp_path, text, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(CniError) as err:
        config.load(str(p))
    assert err.value.code == 7 and str(p) in err.value.msg and needle in err.value.msg


def record(**kw):
    base = dict(network="net-a", container_id="c" * 64, ifname="net1", mode="ovs", netns="/run/netns/p",
                pod=PodRef("ns", "pod", "uid"), plan=OvsPlan(host_ifname="tnx"), conf={"name": "net-a"})
    base.update(kw)
    return AttachmentRecord(**base)


def test_record_roundtrip_mode_0600(tmp_path):
    store = RecordStore(str(tmp_path), plan_type)
    rec = record()
    store.save(rec)
    path = store.path(*rec.key)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    loaded = store.load(*rec.key)
    assert loaded == rec and loaded.progress is None
    assert list(store.list()) == [rec]
    store.remove(*rec.key)
    assert store.load(*rec.key) is None
    assert not (tmp_path / "attachments" / "net-a").exists()  # empty dirs removed too


def test_progress_is_never_persisted(tmp_path):
    store = RecordStore(str(tmp_path), plan_type)
    rec = record()
    rec.progress = {"veth"}
    store.save(rec)
    assert "progress" not in json.loads(open(store.path(*rec.key)).read())


def test_remove_clears_a_killed_writers_temp_file(tmp_path):
    store = RecordStore(str(tmp_path), plan_type)
    rec = record()
    store.save(rec)
    stale = store.path(*rec.key) + ".tmp.4242"
    open(stale, "w").write("{half")
    store.remove(*rec.key)
    assert not os.path.exists(stale)


@pytest.mark.parametrize("field,value", [
    ("network", "../x"), ("container_id", "a/b"), ("ifname", ".."), ("ifname", "x" * 16),
])
def test_unsafe_names_never_become_paths(tmp_path, field, value):
    with pytest.raises(ValueError):
        RecordStore(str(tmp_path)).path(**{"network": "n", "container_id": "c", "ifname": "i", field: value})


def test_corrupt_record_is_reported_not_fatal(tmp_path):
    store = RecordStore(str(tmp_path), plan_type)
    good = record(container_id="good")
    store.save(good)
    bad = store.path("net-a", "bad", "net1")
    os.makedirs(os.path.dirname(bad))
    open(bad, "w").write("{not json")
    items = list(store.list("net-a"))
    assert good in items and any(isinstance(i, CorruptRecord) for i in items)
    with pytest.raises(CorruptRecord):
        store.load("net-a", "bad", "net1")


def test_record_json_carries_every_field_and_round_trips() -> None:
    import dataclasses

    record = AttachmentRecord(network="n", container_id="c" * 12, ifname="net1", mode="ovs",
                              netns="/run/netns/x", pod=PodRef("ns", "p", "u"),
                              plan=OvsPlan(host_ifname="tn0", trunks=[1, 2], cni_args="K8S_POD_NAME=p"),
                              conf={"name": "n"},
                              result={"cniVersion": "1.1.0", "ips": []})
    data = json.loads(record.to_json())
    # A field added to the dataclass but not to to_json would be lost on disk: fail here.
    assert set(data) == {f.name for f in dataclasses.fields(AttachmentRecord)} - {"progress"} | {"format"}
    assert data["plan"] == {"hostIfname": "tn0", "trunks": [1, 2], "cniArgs": "K8S_POD_NAME=p", "bridge": None,
                            "ovsdb": None, "vlan": None, "mtu": None, "ofportRequest": None,
                            "prewarm": "", "prewarmRules": 0}
    again = AttachmentRecord.from_json(record.to_json(), plan_type)
    assert again == record and again.progress is None and isinstance(again.plan, OvsPlan)
    # Without the plan types only the core's part is read; a key it does not know is ignored.
    assert AttachmentRecord.from_json(record.to_json()).plan.cni_args == "K8S_POD_NAME=p"
