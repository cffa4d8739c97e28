#!/usr/bin/env bash
# Install what tenantnet's demo and tests need on Debian 12: only what is missing.
set -euo pipefail
packages=(openvswitch-switch iproute2 iputils-ping containernetworking-plugins python3-venv podman runc busybox-static etcd-server openssl linux-libc-dev gcc libc6-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "==> installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# OVN for the overlay (docs/overlay.md): only its programs are needed. The packages would
# start a system-wide NB/SB/northd and ovn-controller; tenantnet's lab runs its own, so a
# policy-rc.d that refuses service starts is put in place for this install only (an
# existing one, the admin's, is left as it is).
ovn_packages=(ovn-common ovn-central ovn-host)
ovn_missing=()
for p in "${ovn_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || ovn_missing+=("$p")
done
if ((${#ovn_missing[@]})); then
  echo "==> installing Debian packages: ${ovn_missing[*]} (their services are not started)"
  export DEBIAN_FRONTEND=noninteractive
  policy=/usr/sbin/policy-rc.d
  placed=""
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\n# placed by tenantnet scripts/install-deps.sh while OVN installs\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    placed=1
  fi
  trap '[[ -n $placed ]] && rm -f "$policy"' EXIT
  ((${#missing[@]})) || apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${ovn_missing[@]}" >/dev/null
  [[ -n $placed ]] && rm -f "$policy"
  placed=""
  trap - EXIT
fi
