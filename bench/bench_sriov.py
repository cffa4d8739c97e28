"""ADD/DEL latency per VF attachment: tenantnet mode `sriov` on the lab's simulated NIC beside
Debian's Go `host-device` plugin moving a comparable netdev, in the same run.

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

from bench.common import interleaved, machine_line, runtime_env, summary, table, write_block  # noqa: E402
from tenantnet import lab  # noqa: E402

PLUGIN = str(Path(sys.executable).parent / "tenantnet")
GO_HOST_DEVICE = "/usr/lib/cni/host-device"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=30, help="attachments per plugin (default 30)")
    ap.add_argument("--out", help="markdown file to update between the bench_sriov markers")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tn-bench-vf-"))
    info = lab.up(str(work / "lab"), vfs=1)
    vf = info.nics[0]["vfs"][0]
    hostlocal = str(work / "host-local")
    base_env = runtime_env(info.node_config)

    def ipam(subnet: str) -> dict:
        return {"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": hostlocal}

    ours = {"cniVersion": "1.0.0", "name": "bench-vf", "type": "tenantnet", "deviceID": vf["address"],
            "vlan": 100, "ipam": ipam("10.203.0.0/16")}
    # A veth end stands in for the Go plugin's device: a netdev in the host, like the lab VF.
    subprocess.run(["ip", "link", "add", "tnbhd0", "type", "veth", "peer", "name", "tnbhd0p"], check=True)
    go = {"cniVersion": "1.0.0", "name": "bench-hd", "type": "host-device", "device": "tnbhd0",
          "ipam": ipam("10.204.0.0/16")}
    try:
        times = interleaved([("ours", PLUGIN, ours), ("go", GO_HOST_DEVICE, go)], base_env, args.count)
    finally:
        subprocess.run(["ip", "link", "delete", "tnbhd0"], capture_output=True, check=False)
        lab.down(info.root)
        subprocess.run(["rm", "-rf", str(work)], check=False)

    s = {k: summary(v) for k, v in times.items()}
    lines = [machine_line(args.count, "attachments per plugin"), "",
             *table([("ADD", s["ours-add"], s["go-add"]), ("DEL", s["ours-del"], s["go-del"])],
                    "tenantnet `sriov` (lab VF)", "Go `host-device`+`host-local`")]
    write_block(args.out, "bench_sriov", lines)


if __name__ == "__main__":
    main()
