"""Reading a resolv.conf into a CNI DNS object, as host-local's `resolvConf` option does."""

from __future__ import annotations

from cni.errors import CniError, Code
from cni.result import DNS


def parse_resolv_conf(path: str) -> DNS:
    """nameserver, domain, search and options lines; comments and unknown lines ignored."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise CniError(
            Code.INVALID_CONFIG,
            f"invalid network config: ipam.resolvConf={path!r}: cannot be read: "
            f"{exc.strerror or exc}",
        ) from None
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
