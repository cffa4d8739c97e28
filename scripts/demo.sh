#!/usr/bin/env bash
# The tenantnet demo on the built-in lab: three pods on two tenant VLANs of one OVS bridge.
# Pods a and b share VLAN 100; pod c is on VLAN 200 *in the same IP subnet*, so the only
# thing keeping c from a is the VLAN tag — exactly what the ping matrix shows.
set -euo pipefail
cd "$(dirname "$0")/.."

CTL=.venv/bin/tenantnetctl
LAB=/run/tenantnet-lab
export TENANTNET_CONFIG=$LAB/tenantnet.yaml
V100=packaging/examples/ovs-vlan100.json
V200=packaging/examples/ovs-vlan200.json
bold() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
failures=0

cleanup() {
  set +e
  bold "detaching every pod and taking the lab down"
  for pod in a b; do $CTL detach --config $V100 --pod demo/$pod >/dev/null 2>&1; done
  $CTL detach --config $V200 --pod demo/c >/dev/null 2>&1
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

trap - EXIT
cleanup
bold "what is left behind"
left=0
for port in $PORTS; do [ -e "/sys/class/net/$port" ] && left=$((left+1)); done
pods_left=$(ip netns list | grep -c '^tnpod_demo_' || true)
echo "  host links of the demo's attachments left: $left; demo pod namespaces left: $pods_left"
[ "$left" -eq 0 ] && [ "$pods_left" -eq 0 ] || failures=$((failures+1))
if [ "$failures" -eq 0 ]; then bold "demo passed"; else bold "demo FAILED ($failures problems)"; exit 1; fi
