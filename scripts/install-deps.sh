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
