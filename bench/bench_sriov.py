"""ADD/DEL latency per VF attachment: tenantnet mode `sriov` on the lab's simulated NIC beside
Debian's Go `host-device` plugin moving a comparable netdev, in the same run: through the
trampoline + agent (with tenantnet-ipam in the agent, and with Go host-local exec'd), and
in-process (no agent).

Both move an existing host netdev into the pod netns (the costly part, ≈ 19 ms on this
kernel) and back on DEL; tenantnet also reads and records the VF's state, configures it
through the (lab) PF and restores it. Both use Debian's host-local for the address.

    .venv/bin/python bench/bench_sriov.py [--count 30] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    PLUGIN,
    interleaved,
    machine_line,
    node_configs,
    runtime_env,
    start_agent,
    stop_agent,
    summary,
    table,
    write_block,
)
from tenantnet.lab import node as lab  # noqa: E402

GO_HOST_DEVICE = "/usr/lib/cni/host-device"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=30, help="attachments per plugin (default 30)")
    ap.add_argument("--out", help="markdown file to update between the bench_sriov markers")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tn-bench-vf-"))
    info = lab.up(str(work / "lab"), vfs=3)
    vf, vf_inproc, vf_own = (info.nics[0]["vfs"][i] for i in range(3))
    hostlocal = str(work / "host-local")
    agent_conf, plain_conf = node_configs(info.node_config, work)
    agent = start_agent(agent_conf, work / "agent.err")

    def ipam(subnet: str) -> dict:
        return {"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": hostlocal}

    ours = {"cniVersion": "1.0.0", "name": "bench-vf", "type": "tenantnet", "deviceID": vf["address"],
            "vlan": 100, "ipam": ipam("10.203.0.0/16")}
    inproc = {**ours, "name": "bench-vf-inproc", "deviceID": vf_inproc["address"],
              "ipam": ipam("10.205.0.0/16")}
    own = {**ours, "name": "bench-vf-own", "deviceID": vf_own["address"],
           "ipam": {"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.206.0.0/16"}]],
                    "dataDir": str(work / "ipam")}}
    # A veth end stands in for the Go plugin's device: a netdev in the host, like the lab VF.
    subprocess.run(["ip", "link", "add", "tnbhd0", "type", "veth", "peer", "name", "tnbhd0p"], check=True)
    go = {"cniVersion": "1.0.0", "name": "bench-hd", "type": "host-device", "device": "tnbhd0",
          "ipam": ipam("10.204.0.0/16")}
    try:
        times = interleaved([("own", PLUGIN, own, str(agent_conf)),
                             ("ours", PLUGIN, ours, str(agent_conf)),
                             ("go", GO_HOST_DEVICE, go, str(plain_conf)),
                             ("inproc", PLUGIN, inproc, str(plain_conf))], runtime_env(), args.count)
    finally:
        stop_agent(agent)
        subprocess.run(["ip", "link", "delete", "tnbhd0"], capture_output=True, check=False)
        lab.down(info.root)
        subprocess.run(["rm", "-rf", str(work)], check=False)

    s = {k: summary(v) for k, v in times.items()}
    go_label = "Go `host-device`+`host-local`"

    def rows(who: str) -> list[tuple[str, dict, dict]]:
        return [("ADD", s[f"{who}-add"], s["go-add"]), ("DEL", s[f"{who}-del"], s["go-del"])]

    ours = "tenantnet `sriov` (lab VF), trampoline+agent"
    lines = [machine_line(args.count, "attachments per plugin"), "",
             *table(rows("own"), f"{ours}, tenantnet-ipam", go_label), "",
             *table(rows("ours"), f"{ours}, Go host-local", go_label), "",
             *table(rows("inproc"), "tenantnet `sriov` (lab VF), in-process (no agent)", go_label)]
    write_block(args.out, "bench_sriov", lines)


if __name__ == "__main__":
    main()
