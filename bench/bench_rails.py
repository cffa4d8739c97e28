"""An 8-rail GPU pod's eight ADDs (then DELs) through the trampoline and agent on the lab's simulated
8-GPU / 8-NIC server, beside Debian's Go `host-device` doing the same eight moves, in one run.

Variants, interleaved round by round (each round a fresh pod namespace, made and removed
outside the timing):
- `plain`: mode sriov, `rdma: off`, no rail alignment — a VF chosen from the 8 NICs, moved;
- `rdma`: plus the VF's RDMA device moved into the pod (the lab's simulated RDMA control);
- `rdma+rails`: plus `railAlignment` — the pod's GPUs asked of the (simulated) kubelet's
  pod-resources API, the PCIe tree read, each rail paired with one GPU;
- Go `host-device`: the eight VF netdevs moved by name (what a device-plugin + host-device
  setup does; no PF-side VF configuration, no RDMA, no alignment).
No IPAM in any of them: the figure is the attachment. A simulation (no real NIC, GPU or RDMA
device); the wall time of the eight ADDs of a pod, one after another as Multus runs them.

    .venv/bin/python bench/bench_rails.py [--rounds 10] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    PLUGIN,
    exec_plugin,
    node_configs,
    runtime_env,
    start_agent,
    stop_agent,
    summary,
    write_block,
)
from tenantnet.lab import gpuserver  # noqa: E402
from tenantnet.lab import node as lab  # noqa: E402
from tenantnet.lab.nic import LabNic  # noqa: E402

GO_HOST_DEVICE = "/usr/lib/cni/host-device"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="pods per variant (default 10)")
    ap.add_argument("--out", help="markdown file to update between the bench_rails markers")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tnbr-"))
    info = lab.up(str(work / "lab"), vfs=1, gpus=8)
    agent_conf, _ = node_configs(info.node_config, work)
    agent = start_agent(agent_conf, work / "agent.err")
    nics = sorted(LabNic(info.root).describe(), key=lambda n: n["pf"])
    pfs = [n["pf"] for n in nics]
    netdevs = [n["vfs"][0]["netdev"] for n in nics]
    base = {"cniVersion": "1.0.0", "type": "tenantnet", "mode": "sriov", "pfs": pfs}
    variants = {
        "plain": {**base, "rdma": "off"},
        "rdma": {**base, "rdma": "exclusive"},
        "rdma+rails": {**base, "rdma": "exclusive", "railAlignment": {"within": "PIX", "action": "refuse"}},
    }
    times: dict[str, list[float]] = {f"{v}-{verb}": [] for v in [*variants, "go"] for verb in ("add", "del")}
    try:
        for r in range(args.rounds):
            for variant, conf in [*variants.items(), ("go", {})]:
                pod = f"p{r}-{variant.replace('+', '-')}"
                gpuserver.assign_gpus(info.root, "bench", pod, 8)
                ns = f"tnbr-{uuid.uuid4().hex[:8]}"
                subprocess.run(["ip", "netns", "add", ns], check=True)
                cid = uuid.uuid4().hex
                env = {**runtime_env(str(agent_conf)), "CNI_CONTAINERID": cid,
                       "CNI_NETNS": f"/run/netns/{ns}",
                       "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={pod}"}
                try:
                    for verb in ("ADD", "DEL"):
                        start = time.perf_counter()
                        for i in range(8):
                            one = {**env, "CNI_COMMAND": verb, "CNI_IFNAME": f"net{i + 1}"}
                            if variant == "go":
                                hd = {"cniVersion": "1.0.0", "name": f"rail-{i}", "type": "host-device",
                                      "device": netdevs[i]}
                                exec_plugin(GO_HOST_DEVICE, one, hd)
                            else:
                                exec_plugin(PLUGIN, one, {**conf, "name": f"rail-{i}"})
                        times[f"{variant}-{verb.lower()}"].append((time.perf_counter() - start) * 1000)
                finally:
                    subprocess.run(["ip", "netns", "delete", ns], check=False)
                    gpuserver.release_gpus(info.root, "bench", pod)
            print(f"\r{r + 1}/{args.rounds}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    finally:
        stop_agent(agent)
        lab.down(info.root)
        subprocess.run(["rm", "-rf", str(work)], check=False)
    s = {k: summary(v) for k, v in times.items()}
    go_add, go_del = s["go-add"]["median"], s["go-del"]["median"]
    lines = [f"An 8-rail pod's 8 ADDs, then its 8 DELs, one after another (ms for all eight), "
             f"{args.rounds} pods per variant, interleaved; through the trampoline and agent on the lab's "
             "simulated 8-GPU / 8-NIC server (a simulation: VFs are veths, RDMA devices and the kubelet "
             "are simulated). No IPAM.", "",
             "| variant | 8 ADDs median | p90 | 8 DELs median | p90 | ADD ratio to Go | DEL ratio to Go |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    labels = {"plain": "tenantnet sriov (VF chosen, configured, moved)", "rdma": "… + RDMA device moved",
              "rdma+rails": "… + rail alignment (pod-resources, PCIe tree, pairing)",
              "go": "Go `host-device` (netdev moved by name)"}
    for variant, label in labels.items():
        a, d = s[f"{variant}-add"], s[f"{variant}-del"]
        lines.append(f"| {label} | {a['median']:.0f} | {a['p90']:.0f} | {d['median']:.0f} | {d['p90']:.0f} | "
                     f"{a['median'] / go_add:.2f}× | {d['median'] / go_del:.2f}× |")
    write_block(args.out, "bench_rails", lines)


if __name__ == "__main__":
    main()
