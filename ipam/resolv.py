"""Reading a resolv.conf into a CNI DNS object, as host-local's `resolvConf` option does."""

from __future__ import annotations

from collections.abc import Iterable

from cni.result import DNS
from hostfiles.confined import read_confined


def parse_resolv_conf(path: str, allowed: Iterable[str]) -> DNS:
    """nameserver, domain, search and options lines; comments and unknown lines ignored.
    Only a regular file inside `allowed`, at most 64 KiB (hostfiles.confined)."""
    data = read_confined("ipam.resolvConf", path, allowed, "a file") or b""
    text = data.decode("utf-8", "replace")
    dns = DNS()
    for line in text.splitlines():
        words = line.split("#", 1)[0].split(";", 1)[0].split()
        if len(words) < 2:
            continue
        key, values = words[0], words[1:]
        if key == "nameserver":
            dns.nameservers.append(values[0])
        elif key == "domain":
            dns.domain = values[0]
        elif key == "search":
            dns.search = list(values)
        elif key == "options":
            dns.options.extend(values)
    return dns
