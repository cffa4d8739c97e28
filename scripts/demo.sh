#!/usr/bin/env bash
# The tenantnet demo on the built-in lab: three pods on two tenant VLANs of one OVS bridge.
# Pods a and b share VLAN 100; pod c is on VLAN 200 *in the same IP subnet*, so the only
# thing keeping c from a is the VLAN tag — exactly what the ping matrix shows.
# Act 2: three simulated nodes (`lab up --nodes 3`) share one NAD per tenant through
# tenantnet-ipam's cluster mode on etcd; tenant A reaches across the underlay, B does not.
# Act 3: GPU rails on a simulated 8-GPU / 8-NIC server: a misaligned VF refused, an 8-rail pod
# paired 1:1 with its GPUs (PIX), the VFs' RDMA devices in the pod.
# Act 4: the real Kubernetes node: the packaged DaemonSet, two tenants' pods, who reaches whom.
# Act 5: Geneve overlays on OVN (tenantnet/lab/overlaydemo.py): two tenants on overlay rail 1
# across three nodes, one subnet; ICMP, TCP and ARP within a tenant, none across; a spoofed
# source MAC dropped; rail 1's packets on rail 1's underlay, none on rail 0's.
set -euo pipefail
cd "$(dirname "$0")/.."

CTL=.venv/bin/tenantnetctl
LAB=/run/tenantnet-lab
export TENANTNET_CONFIG=$LAB/tenantnet.yaml
V100=packaging/examples/ovs-vlan100.json
V200=packaging/examples/ovs-vlan200.json
WARM=packaging/examples/ovs-rail-prewarm.json
bold() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
failures=0

cleanup() {
  set +e
  bold "detaching every pod and taking the lab down"
  for pod in a b; do $CTL detach --config $V100 --pod demo/$pod >/dev/null 2>&1; done
  $CTL detach --config $V200 --pod demo/c >/dev/null 2>&1
  for pod in p q; do $CTL detach --config $WARM --pod demo/$pod >/dev/null 2>&1; done
  $CTL lab down --dir $LAB
}
trap cleanup EXIT

bold "bringing the lab up (private ovsdb-server + ovs-vswitchd, userspace datapath)"
$CTL lab up --dir $LAB

bold "attaching pods: demo/a and demo/b on VLAN 100, demo/c on VLAN 200"
$CTL attach --config $V100 --pod demo/a --ifname net1 >/dev/null
$CTL attach --config $V100 --pod demo/b --ifname net1 >/dev/null
$CTL attach --config $V200 --pod demo/c --ifname net1 >/dev/null
$CTL ls

addr() { ip -n "tnpod_demo_$1" -4 -o addr show dev net1 | awk '{print $4}' | cut -d/ -f1; }
A=$(addr a); B=$(addr b); C=$(addr c)

bold "OVS ports (tag = VLAN), as ovs-vsctl sees them"
ovs-vsctl --db=unix:$LAB/db.sock --columns=name,tag,external_ids find Port \
  external_ids:tenantnet-owner=tenantnet | grep -E '^(name|tag)' | paste - - | sed 's/  */ /g'
PORTS=$(ovs-vsctl --db=unix:$LAB/db.sock --bare --columns=name find Port external_ids:tenantnet-owner=tenantnet)

bold "reachability (real ICMP through the lab OVS)"
probe() {  # from to-addr expectation
  if ip netns exec "tnpod_demo_$1" ping -c 2 -i 0.2 -W 1 "$2" >/dev/null 2>&1; then got=reaches; else got=blocked; fi
  if [ "$got" = "$3" ]; then mark="ok  "; else mark="FAIL"; failures=$((failures+1)); fi
  printf '  [%s] demo/%s -> %-12s %-8s (expected: %s)\n' "$mark" "$1" "$2" "$got" "$3"
}
probe a "$B" reaches   # same VLAN
probe b "$A" reaches   # same VLAN
probe a "$C" blocked   # VLAN 100 -> VLAN 200, same subnet: only the VLAN separates them
probe c "$A" blocked

bold "CHECK on every attachment"
$CTL check --config $V100 --pod demo/a --ifname net1 | head -1
$CTL check --config $V100 --pod demo/b --ifname net1 | head -1
$CTL check --config $V200 --pod demo/c --ifname net1 | head -1

bold "pre-warm: demo/p and demo/q on a rail with prewarm: true (VLAN 300)"
$CTL attach --config $WARM --pod demo/p --ifname net1 >/dev/null
$CTL attach --config $WARM --pod demo/q --ifname net1 >/dev/null
mac() { ip -n "tnpod_demo_$1" -o link show dev net1 | grep -o 'link/ether [0-9a-f:]*' | cut -d' ' -f2; }
MP=$(mac p); MQ=$(mac q)
# The lab's datapath is OVS's userspace one (a simulation of the NIC's): the flows are real
# datapath flows, made by tenantnet's warm frames; no workload packet has been sent yet.
flows=$(ovs-appctl -t $LAB/ovs-vswitchd.ctl dpctl/dump-flows)
for pair in "$MP $MQ p q" "$MQ $MP q p"; do
  set -- $pair
  line=$(printf '%s\n' "$flows" | grep "eth(src=$1,dst=$2),eth_type(0x0800)" | head -1 || true)
  if [ -n "$line" ]; then echo "  [ok  ] datapath flow demo/$3 -> demo/$4 before any traffic:"
    echo "         ${line:0:150}"
  else echo "  [FAIL] no datapath flow demo/$3 -> demo/$4"; failures=$((failures+1)); fi
done
rules=$(ovs-ofctl dump-flows unix:$LAB/br-lab.mgmt "cookie=0x746e000000000000/0xffff000000000000" | grep -c cookie= || true)
echo "  tenantnet's OpenFlow rules (cookie 0x746e…/16): $rules"
for pod in p q; do $CTL detach --config $WARM --pod demo/$pod >/dev/null; done
rules=$(ovs-ofctl dump-flows unix:$LAB/br-lab.mgmt "cookie=0x746e000000000000/0xffff000000000000" | grep -c cookie= || true)
if [ "$rules" -eq 0 ]; then echo "  [ok  ] detached: no rule of ours left"; else
  echo "  [FAIL] $rules pre-warm rules left after DEL"; failures=$((failures+1)); fi

trap - EXIT
cleanup
bold "what is left behind"
left=0
for port in $PORTS; do [ -e "/sys/class/net/$port" ] && left=$((left+1)); done
pods_left=$(ip netns list | grep -c '^tnpod_demo_' || true)
echo "  host links of the demo's attachments left: $left; demo pod namespaces left: $pods_left"
[ "$left" -eq 0 ] && [ "$pods_left" -eq 0 ] || failures=$((failures+1))

# ---- act 2: one NAD over three nodes ---------------------------------------------------------
# A simulation on this machine: three nodes, each its own OVS and node config, joined by a
# trunk top-of-rack switch; one etcd holds tenantnet-ipam's per-node address blocks.
CL=/run/tenantnet-lab-cluster
NADS=$(mktemp -d)
for t in a:100:10:99 b:200:100:199; do
  IFS=: read -r name vlan lo hi <<<"$t"
  cat > "$NADS/tenant-$name.json" <<JSON
{"cniVersion": "1.0.0", "name": "rail-$name", "type": "tenantnet", "bridge": "br-lab", "vlan": $vlan,
 "ipam": {"type": "tenantnet-ipam", "cluster": {"blockSize": 28, "releaseAfter": 0},
          "ranges": [[{"subnet": "10.60.0.0/24", "rangeStart": "10.60.0.$lo", "rangeEnd": "10.60.0.$hi"}]]}}
JSON
done
N() { echo "$CL/node$1/tenantnet.yaml"; }
cleanup2() {
  set +e
  bold "act 2: detaching every pod and taking the three nodes down"
  $CTL --node-config "$(N 1)" detach --config "$NADS/tenant-a.json" --pod demo2/a1 >/dev/null 2>&1
  $CTL --node-config "$(N 2)" detach --config "$NADS/tenant-a.json" --pod demo2/a2 >/dev/null 2>&1
  $CTL --node-config "$(N 3)" detach --config "$NADS/tenant-a.json" --pod demo2/a3 >/dev/null 2>&1
  $CTL --node-config "$(N 2)" detach --config "$NADS/tenant-b.json" --pod demo2/b2 >/dev/null 2>&1
  $CTL lab down --dir $CL >/dev/null
  rm -rf "$NADS"
}
trap cleanup2 EXIT

bold "act 2: three simulated nodes, a trunk top-of-rack switch, etcd (a simulation)"
$CTL lab up --nodes 3 --dir $CL

bold "act 2: tenant A's pods on nodes 1, 2 and 3; tenant B's on node 2 (same subnet, VLAN 200)"
$CTL --node-config "$(N 1)" attach --config "$NADS/tenant-a.json" --pod demo2/a1 --ifname net1 >/dev/null
$CTL --node-config "$(N 2)" attach --config "$NADS/tenant-a.json" --pod demo2/a2 --ifname net1 >/dev/null
$CTL --node-config "$(N 3)" attach --config "$NADS/tenant-a.json" --pod demo2/a3 --ifname net1 >/dev/null
$CTL --node-config "$(N 2)" attach --config "$NADS/tenant-b.json" --pod demo2/b2 --ifname net1 >/dev/null
addr2() { ip -n "tnpod_demo2_$1" -4 -o addr show dev net1 | awk '{print $4}' | cut -d/ -f1; }
A1=$(addr2 a1); A2=$(addr2 a2); A3=$(addr2 a3); B2=$(addr2 b2)
echo "  addresses: a1 $A1 (node1), a2 $A2 (node2), a3 $A3 (node3), b2 $B2 (node2)"
unique=$(printf '%s\n' "$A1" "$A2" "$A3" "$B2" | sort -u | wc -l)
if [ "$unique" -eq 4 ]; then echo "  [ok  ] four pods, four addresses from one pool per network"; else
  echo "  [FAIL] duplicate addresses across nodes"; failures=$((failures+1)); fi
$CTL --node-config "$(N 1)" ipam nodes

bold "act 2: reachability across the underlay (real ICMP)"
probe2() {  # from to-addr expectation
  if ip netns exec "tnpod_demo2_$1" ping -c 2 -i 0.2 -W 1 "$2" >/dev/null 2>&1; then got=reaches; else got=blocked; fi
  if [ "$got" = "$3" ]; then mark="ok  "; else mark="FAIL"; failures=$((failures+1)); fi
  printf '  [%s] demo2/%s -> %-12s %-8s (expected: %s)\n' "$mark" "$1" "$2" "$got" "$3"
}
probe2 a1 "$A2" reaches   # tenant A, node 1 -> node 2
probe2 a2 "$A3" reaches   # tenant A, node 2 -> node 3
probe2 a1 "$B2" blocked   # tenant B on the same rail, another VLAN
probe2 b2 "$A2" blocked   # ... even on the same node

trap - EXIT
cleanup2
pods_left=$(ip netns list | grep -c '^tnpod_demo2_' || true)
echo "  act 2: pod namespaces left: $pods_left; cluster lab directory left: $([ -e $CL ] && echo yes || echo no)"
[ "$pods_left" -eq 0 ] && [ ! -e $CL ] || failures=$((failures+1))

# ---- act 3: GPU rails ---------------------------------------------------------------------------
# A simulation: an 8-GPU / 8-NIC server's PCIe tree in a fake sysfs (a PCIe switch per GPU
# with one ConnectX NIC beside it), the NICs' VFs as veths, simulated RDMA devices and a
# simulated kubelet answering the pod-resources API.
GL=/run/tenantnet-lab-gpu
G="$GL/tenantnet.yaml"
RAILS=$(mktemp -d)
PFS=""
cleanup3() {
  set +e
  bold "act 3: detaching the rails and taking the GPU server down"
  for i in 0 1 2 3 4 5 6 7; do
    $CTL --node-config "$G" detach --config "$RAILS/rail-$i.json" --pod demo3/trainer --ifname "net$((i + 1))" >/dev/null 2>&1
  done
  $CTL lab down --dir $GL >/dev/null
  rm -rf "$RAILS"
}
trap cleanup3 EXIT
bold "act 3: a simulated 8-GPU / 8-NIC server (two sockets, a PCIe switch per GPU+NIC) and its kubelet"
$CTL lab up --gpus 8 --vfs 1 --dir $GL >/dev/null
PFS=$($CTL --node-config "$G" rails --json | python3 -c 'import json,sys; print(json.dumps([n["nic"] for n in json.load(sys.stdin)["nics"]]))')
for i in 0 1 2 3 4 5 6 7; do
  cat > "$RAILS/rail-$i.json" <<JSON
{"cniVersion": "1.0.0", "name": "rail-$i", "type": "tenantnet", "mode": "sriov", "pfs": $PFS, "vlan": $((300 + i)),
 "railAlignment": {"within": "PIX", "action": "refuse"}, "rdma": "exclusive",
 "ipam": {"type": "tenantnet-ipam", "dataDir": "$GL/ipam", "ranges": [[{"subnet": "10.7$i.0.0/24"}]]}}
JSON
done
FAR=$($CTL --node-config "$G" rails --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["nics"][5]["freeVfs"][0])')
cat > "$RAILS/misaligned.json" <<JSON
{"cniVersion": "1.0.0", "name": "rail-x", "type": "tenantnet", "mode": "sriov", "deviceID": "$FAR",
 "railAlignment": {"within": "PIX", "action": "refuse"}}
JSON

bold "act 3: a one-GPU pod handed a VF on the other socket by the device plugin: refused"
$CTL lab gpus --dir $GL --pod demo3/small --count 1
if out=$($CTL --node-config "$G" attach --config "$RAILS/misaligned.json" --pod demo3/small --ifname net1 2>/dev/null); then
  echo "  [FAIL] the misaligned VF was attached"; failures=$((failures+1))
else
  if [ "$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["code"])')" = 107 ]; then
    echo "  [ok  ] refused with code 107:"; printf '%s' "$out" | python3 -c 'import json,sys; print("         " + json.load(sys.stdin)["msg"])'
  else echo "  [FAIL] refused, but not with code 107: $out"; failures=$((failures+1)); fi
fi
$CTL lab gpus --dir $GL --pod demo3/small --count 0 >/dev/null

bold "act 3: an 8-GPU pod with 8 rails, each VF chosen by tenantnet from all 8 NICs"
$CTL lab gpus --dir $GL --pod demo3/trainer --count 8
for i in 0 1 2 3 4 5 6 7; do
  $CTL --node-config "$G" attach --config "$RAILS/rail-$i.json" --pod demo3/trainer --ifname "net$((i + 1))" >/dev/null
done
$CTL --node-config "$G" rails
pix=$($CTL --node-config "$G" rails --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(sum(p["distance"] == "PIX" for p in d["pairings"]), len({p["gpu"] for p in d["pairings"]}))')
if [ "$pix" = "8 8" ]; then echo "  [ok  ] 8 rails, 8 distinct GPUs, each VF on the NIC beside its GPU (PIX)"; else
  echo "  [FAIL] pairings: $pix (PIX count, distinct GPUs)"; failures=$((failures+1)); fi
rdma=$($CTL --node-config "$G" ls --json | python3 -c 'import json,sys; print(sum(1 for r in json.load(sys.stdin) if r.get("rdmaInPod")))')
if [ "$rdma" = "8" ]; then echo "  [ok  ] the 8 VFs' RDMA devices are in the pod's namespace (simulated RDMA)"; else
  echo "  [FAIL] RDMA devices in the pod: $rdma of 8"; failures=$((failures+1)); fi

trap - EXIT
cleanup3
pods_left=$(ip netns list | grep -c '^tnpod_demo3_' || true)
echo "  act 3: pod namespaces left: $pods_left; GPU lab directory left: $([ -e $GL ] && echo yes || echo no)"
[ "$pods_left" -eq 0 ] && [ ! -e $GL ] || failures=$((failures+1))

# ---- act 4: the real Kubernetes node ------------------------------------------------------------
# The lab's Kubernetes node (`lab up --kubernetes`: etcd, kube-apiserver, scheduler, kubelet,
# containerd, Multus), the packaged DaemonSet and renderer on it (tenantnet/lab/kubedeploy.py:
# the image built here from the relocatable runtime), a TenantNetwork for each of two tenants,
# two pods each; without the Kubernetes binaries this act fails, saying why.
KL=/run/tenantnet-demo-kube
cleanup4() {
  set +e
  bold "act 4: taking the Kubernetes node down (pods first: their DEL)"
  $CTL lab down --dir $KL >/dev/null
}
trap cleanup4 EXIT

bold "act 4: a real Kubernetes node, the packaged DaemonSet on it, two tenants"
if up=$($CTL lab up --kubernetes --dir $KL --json 2>&1); then
  secs=$(printf '%s' "$up" | python3 -c 'import json,sys; print(json.load(sys.stdin)["timings"]["bringUp"])' 2>/dev/null || echo '?')
  echo "  [ok  ] node tenantnet-lab Ready (kubelet, containerd, Multus thin), up in $secs s"
  set +e
  .venv/bin/python -m tenantnet.lab.kubedeploy $KL
  rc=$?
  set -e
  failures=$((failures+rc))
else
  echo "  [FAIL] the Kubernetes node did not come up: $(printf '%s' "$up" | tail -3)"
  failures=$((failures+1))
fi

trap - EXIT
cleanup4
echo "  act 4: Kubernetes lab directory left: $([ -e $KL ] && echo yes || echo no)"
[ ! -e $KL ] || failures=$((failures+1))

# ---- act 5: Geneve overlays on OVN --------------------------------------------------------------
# A simulation (tenantnet/lab/ovn.py): OVN central, three nodes in network namespaces with two
# rail NICs each (one OVN chassis per rail); the pods attached by the plugin exec'd inside each
# node. The module prints its own steps and takes its lab down itself, also on failure; the
# trap is for an interrupted run.
OL=/run/tenantnet-demo-overlay
cleanup5() { set +e; $CTL lab down --dir $OL >/dev/null 2>&1; }
trap cleanup5 EXIT
set +e
.venv/bin/python -m tenantnet.lab.overlaydemo $OL
rc=$?
set -e
failures=$((failures+rc))
trap - EXIT
cleanup5
echo "  act 5: overlay lab directory left: $([ -e $OL ] && echo yes || echo no)"
[ ! -e $OL ] || failures=$((failures+1))

if [ "$failures" -eq 0 ]; then bold "demo passed"; else bold "demo FAILED ($failures problems)"; exit 1; fi
