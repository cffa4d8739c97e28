"""The manual harness's pure parts: pod names, NAD files."""

from __future__ import annotations

import json

import pytest

from tenantnet.ops.harness import HarnessError, Pod, load_network_config


def test_pod_identity_is_deterministic():
    a, b = Pod.parse("team-a/train-0"), Pod.parse("team-a/train-0")
    assert a.container_id == b.container_id and len(a.container_id) == 64
    assert a.netns_path == "/run/netns/tnpod_team-a_train-0"
    assert "K8S_POD_NAMESPACE=team-a" in a.cni_args() and "MAC=02:00:00:00:00:01" in a.cni_args("02:00:00:00:00:01")
    assert Pod.parse("solo").namespace == "default"


@pytest.mark.parametrize("text", ["a/../b", "A/b", "ns/", "x" * 64 + "/p", "ns/p q"])
def test_bad_pod_names(text):
    with pytest.raises(HarnessError):
        Pod.parse(text)


def test_nad_yaml_and_plain_json(tmp_path):
    nad = tmp_path / "nad.yaml"
    nad.write_text(
        "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\n"
        "metadata: {name: rail-1}\nspec:\n  config: '{\"cniVersion\": \"1.0.0\", \"type\": \"tenantnet\"}'\n")
    assert load_network_config(str(nad)) == {"cniVersion": "1.0.0", "type": "tenantnet", "name": "rail-1"}
    plain = tmp_path / "c.json"
    plain.write_text(json.dumps({"cniVersion": "1.0.0", "name": "x"}))
    assert load_network_config(str(plain))["name"] == "x"
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: NetworkAttachmentDefinition\nspec: {config: '{nope'}\n")
    with pytest.raises(HarnessError, match="spec.config is not valid JSON"):
        load_network_config(str(bad))
