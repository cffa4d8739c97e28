"""ADD/DEL latency per attachment: tenantnet mode `ovs` beside Debian's Go `bridge` +
`host-local`, measured in the same run on this machine.

Both plugins are exec'd exactly as a runtime would (env + stdin), one attachment at a time,
interleaved so that machine noise hits both alike; netns creation is outside the timing.
tenantnet attaches to the lab's userspace OVS; the Go bridge plugin to a Linux bridge it
creates. Both get their address from the same Go host-local.

    .venv/bin/python bench/bench_ovs.py [--count 40] [--out docs/benchmarks.md]
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
    allow_data_dir,
    interleaved,
    machine_line,
    runtime_env,
    summary,
    table,
    write_block,
)
from tenantnet.lab import node as lab  # noqa: E402

GO_BRIDGE = "/usr/lib/cni/bridge"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=40, help="attachments per plugin (default 40)")
    ap.add_argument("--out", help="markdown file to update between the bench_ovs markers")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tn-bench-"))
    info = lab.up(str(work / "lab"))
    hostlocal = work / "host-local"
    node = work / "node.yaml"  # the lab's, letting the bench's dataDirs live under work
    node.write_text(allow_data_dir(Path(info.node_config).read_text(), work))
    base_env = runtime_env(str(node))
    ipam = {"type": "host-local", "ranges": [[{"subnet": "10.201.0.0/16"}]], "dataDir": str(hostlocal)}
    ours = {"cniVersion": "1.0.0", "name": "bench-ovs", "type": "tenantnet", "bridge": info.bridge,
            "vlan": 100, "ipam": ipam}
    go = {"cniVersion": "1.0.0", "name": "bench-go", "type": "bridge", "bridge": "tnbench0",
          "ipam": {**ipam, "ranges": [[{"subnet": "10.202.0.0/16"}]]}}
    try:
        times = interleaved([("ours", PLUGIN, ours), ("go", GO_BRIDGE, go)], base_env, args.count)
    finally:
        subprocess.run(["ip", "link", "delete", "tnbench0"], capture_output=True, check=False)
        lab.down(info.root)
        subprocess.run(["rm", "-rf", str(work)], check=False)

    s = {k: summary(v) for k, v in times.items()}
    lines = [machine_line(args.count, "attachments per plugin"), "",
             *table([("ADD", s["ours-add"], s["go-add"]), ("DEL", s["ours-del"], s["go-del"])],
                    "tenantnet `ovs`", "Go `bridge`+`host-local`")]
    write_block(args.out, "bench_ovs", lines)


if __name__ == "__main__":
    main()
