"""Which implementation of a device control a node uses: `netlink` (the kernel's) or
`<scheme>:<argument>`, served by a provider registered under that scheme.

Providers outside the plugin wing — the lab's simulations — register themselves when
imported; the node config names the modules to import (`vfControlModules`,
`rdmaControlModules`). So the plugin never imports the lab, and a simulation is used only
where the admin's node config says so. `vfcontrol.py` and `rdmacontrol.py` each keep one
`Providers`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class Providers(Generic[T]):
    def __init__(self, key: str, what: str, netlink: Callable[[], T]) -> None:
        self.key, self.what, self.netlink = key, what, netlink  # e.g. "vfControl", "VF control"
        self._factories: dict[str, Callable[[str], T]] = {}

    def register(self, scheme: str, factory: Callable[[str], T]) -> None:
        """Serve `<key>: <scheme>:<argument>` with `factory(argument)`."""
        self._factories[scheme] = factory

    def control_for(self, spec: str, modules: Iterable[str] = ()) -> T:
        """The control `spec` names; `modules` are imported first when no provider of the
        scheme is registered yet."""
        if spec == "netlink":
            return self.netlink()
        scheme, _, argument = spec.partition(":")
        modules = list(modules)
        if scheme not in self._factories:
            import importlib

            for module in modules:
                importlib.import_module(module)
        factory = self._factories.get(scheme)
        if factory is None:
            from cni.errors import CniError, Code

            raise CniError(Code.INVALID_CONFIG, f"invalid node config: {self.key} {spec!r}: no {self.what} "
                                                f"provides {scheme!r} ({self.key}Modules: {modules})")
        return factory(argument)
