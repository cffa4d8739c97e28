"""A process playing the agent's DRA driver for tests/integration/test_dra.py, so a named crash
point (`TENANTNET_TEST_FAULT=dra.…`) SIGKILLs a whole "agent" and another process recovers.

    python -m tests.integration.dra_child SPEC.json

SPEC: {"nodeConfig": path, "nodeName": str, "claims": path of {"<ns>/<name>": claim object},
"ops": [[op, arg], ...]} with op one of prepare/unprepare (arg: {"namespace","name","uid"}),
run/stop/remove (arg: a PodSandbox as a dict), sync (arg: a list of them). One JSON line per
op on stdout: {"op", "ok", "result"|"error"}. The claims' `status.devices` the driver writes
go to `<claims>.status.json`. The driver's CNI calls are the in-process plugin's, as in the
agent (tenantnet/entry/agent.py `_dra_cni`), minus the agent's queueing.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


class FileClaimApi:
    def __init__(self, path: str) -> None:
        self.path = path

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        with open(self.path, encoding="utf-8") as fh:
            claims = json.load(fh)
        key = f"{namespace}/{name}"
        if key not in claims:
            raise LookupError(f"resourceclaims.resource.k8s.io {name!r} not found")
        claim: dict[str, Any] = claims[key]
        return claim

    def set_network_data(self, namespace: str, name: str, uid: str, entries: list[dict[str, Any]]) -> None:
        out = self.path + ".status.json"
        data = json.loads(open(out).read()) if os.path.exists(out) else {}
        data[f"{namespace}/{name}"] = entries
        with open(out, "w", encoding="utf-8") as fh:
            json.dump(data, fh)


def main() -> int:
    from tenantnet.entry import plugin as entry
    from tenantnet.kube.dra import DraDriver
    from tenantnet.kube.kubeletplugin import ClaimRef
    from tenantnet.kube.nri import NriRefusal, PodSandbox
    from tenantnet.plugin import log, nodeconfig

    with open(sys.argv[1], encoding="utf-8") as fh:
        spec = json.load(fh)
    node_path = spec["nodeConfig"]
    node = nodeconfig.load(node_path)

    def cni(environ: dict[str, str], stdin: bytes) -> tuple[int, str]:
        return entry.run_call({**environ, "TENANTNET_CONFIG": node_path}, stdin, lambda: nodeconfig.load(node_path),
                              set_up_logging=False)

    driver = DraDriver(node, spec["nodeName"], FileClaimApi(spec["claims"]), cni, log.get("tenantnet.test.dra"),
                       cni_path=os.path.dirname(sys.executable))
    for op, arg in spec["ops"]:
        try:
            if op == "prepare":
                got = driver.prepare([ClaimRef(**arg)])[arg["uid"]]
                result: Any = {"error": got.error, "devices": [
                    {"requests": list(d.requests), "pool": d.pool, "device": d.device, "cdi": list(d.cdi_ids)}
                    for d in got.devices]}
            elif op == "unprepare":
                result = driver.unprepare([ClaimRef(**arg)])[arg["uid"]]
            elif op in ("run", "stop", "remove"):
                getattr(driver, f"{op}_pod_sandbox")(PodSandbox(**arg))
                result = None
            elif op == "sync":
                driver.reconcile([PodSandbox(**p) for p in arg])  # synchronize's work, waited for
                result = None
            else:
                raise ValueError(f"unknown op {op}")
            print(json.dumps({"op": op, "ok": True, "result": result}), flush=True)
        except NriRefusal as exc:
            print(json.dumps({"op": op, "ok": False, "error": str(exc)}), flush=True)
    driver.close(wait=True)  # the claims' status writes too
    return 0


if __name__ == "__main__":
    sys.exit(main())
