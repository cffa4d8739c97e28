"""Who a namespace's tenant is: one resolver, for the renderer and for every node.

A tenant is named by labels on the namespace, read from the sources the admin lists in the
node config's `tenantSources`, in that order:

- `label`: an explicit `tenantnet.io/tenant: <tenant>` label;
- `capsule`: Capsule's `capsule.clastix.io/tenant` label;
- `hnc`: the hierarchical-namespace controller's depth labels
  (`<ancestor>.tree.hnc.x-k8s.io/depth: N` for the namespace itself and each ancestor) —
  the root ancestor is the tenant;
- `name`: the namespace's name against the tenancy policy's globs (exact names first, then
  the longest pattern), as before Kubernetes mode.

Every listed source is asked; those that answer must agree. Sources that disagree, or a
label that is no tenant name or no HNC tree, give no tenant and say why: fail closed. Labels
are the admin's (or Capsule's and HNC's, whose webhooks keep tenants from writing them):
docs/kubernetes.md, "Trust model".
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass

TENANT_LABEL = "tenantnet.io/tenant"
CAPSULE_LABEL = "capsule.clastix.io/tenant"
HNC_SUFFIX = ".tree.hnc.x-k8s.io/depth"
SOURCES = ("label", "capsule", "hnc", "name")
DEFAULT_SOURCES = ("label",)

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_HNC_LABEL = re.compile(r"(?P<ns>[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)" + re.escape(HNC_SUFFIX))


def dns_label(value: object) -> bool:
    return isinstance(value, str) and _DNS_LABEL.fullmatch(value) is not None


@dataclass(frozen=True)
class Resolution:
    """A namespace's tenant, or why it has none. `answers` are the sources that gave one, in
    the admin's order; `conflict` when they disagree (or one is malformed): fail closed."""

    namespace: str
    tenant: str | None
    reason: str
    answers: tuple[tuple[str, str], ...] = ()
    conflict: bool = False


@dataclass(frozen=True)
class TenantResolver:
    """Which labels name a namespace's tenant, in the admin's order (node config
    `tenantSources`), and the namespace-name globs of the `name` source (the tenancy
    policy's `namespaces`: exact names win, then the longest pattern)."""

    sources: tuple[str, ...] = DEFAULT_SOURCES
    name_patterns: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def resolve(self, namespace: str, labels: Mapping[str, str]) -> Resolution:
        answers: list[tuple[str, str]] = []
        for source in self.sources:
            got, malformed = self._ask(source, namespace, labels)
            if malformed:
                return Resolution(namespace, None, f"namespace {namespace}: source {source}: {malformed}; "
                                                   "no tenant (fail closed)", tuple(answers), True)
            if got is not None:
                answers.append((source, got))
        said = ", ".join(f"{s} says {t}" for s, t in answers)
        tenants = {t for _, t in answers}
        if len(tenants) > 1:
            return Resolution(namespace, None, f"namespace {namespace}: the tenant sources disagree "
                                               f"({said}); no tenant (fail closed)", tuple(answers), True)
        if not answers:
            return Resolution(namespace, None, f"namespace {namespace} belongs to no tenant (sources "
                                               f"consulted: {', '.join(self.sources) or 'none'})")
        tenant = answers[0][1]
        return Resolution(namespace, tenant, f"namespace {namespace} is tenant {tenant}'s ({said})",
                          tuple(answers))

    def _ask(self, source: str, namespace: str, labels: Mapping[str, str]) -> tuple[str | None, str]:
        """(the source's tenant or None, "" or why its answer is malformed)."""
        if source in ("label", "capsule"):
            key = TENANT_LABEL if source == "label" else CAPSULE_LABEL
            value = labels.get(key)
            if value is None:
                return None, ""
            return (value, "") if dns_label(value) else (None, f"{key}={value!r} is not a tenant name")
        if source == "hnc":
            return _hnc_root(labels)
        # "name": exact names first, then the longest glob (as the tenancy policy's tenant_of).
        for tenant, patterns in self.name_patterns:
            if namespace in patterns:
                return tenant, ""
        best: tuple[int, str] | None = None
        for tenant, patterns in self.name_patterns:
            for p in patterns:
                if fnmatch.fnmatchcase(namespace, p) and (best is None or len(p) > best[0]):
                    best = (len(p), tenant)
        return (best[1] if best else None), ""


def _hnc_root(labels: Mapping[str, str]) -> tuple[str | None, str]:
    """HNC labels a namespace `<ancestor>.tree.hnc.x-k8s.io/depth: N` for itself (0) and each
    ancestor: the root ancestor, the deepest, is the tenant. Two at one depth, or a depth
    that is no number, is no tree HNC writes: malformed."""
    depths: dict[int, list[str]] = {}
    for key, value in labels.items():
        m = _HNC_LABEL.fullmatch(key)
        if m is None:
            continue
        if not (isinstance(value, str) and value.isdigit() and len(value) <= 3):
            return None, f"{key}={value!r} is not a depth"
        depths.setdefault(int(value), []).append(m["ns"])
    if not depths:
        return None, ""
    deepest = max(depths)
    if len(depths[deepest]) > 1:
        return None, f"two roots at depth {deepest} ({', '.join(sorted(depths[deepest]))})"
    return depths[deepest][0], ""


def parse_sources(raw: object) -> tuple[str, ...] | None:
    """A node config's `tenantSources`, or None when it is not a list of distinct sources."""
    if not isinstance(raw, list) or not raw or len(set(map(str, raw))) != len(raw) or \
            not all(s in SOURCES for s in raw):
        return None
    return tuple(str(s) for s in raw)
