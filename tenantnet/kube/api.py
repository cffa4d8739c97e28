"""The Kubernetes API as tenantnet's Kubernetes side uses it, through lightkube.

Why lightkube (docs/kubernetes.md, "The client library"): it is small (httpx plus its
models; the official `kubernetes` client pulls in a generated package of thousands of
modules and imports for a second), maintained, typed, and handles what this side needs
without hand-written HTTP — kubeconfig and in-cluster credentials, generic resources for
our CRD and Multus's, list with the collection's resourceVersion, watch from it (renewed
when the server closes the stream, re-listed on 410 Gone), server-side apply, the status
subresource and Leases. Only this package imports it: the agent's watcher and the renderer.
The ADD path never does (tnadmit.py reads the agent's cache).
"""

from __future__ import annotations

from typing import Any

from lightkube import Client, KubeConfig
from lightkube.generic_resource import create_global_resource, create_namespaced_resource

from tenantnet.plugin.tenantnetworks import GROUP, KIND, PLURAL, VERSION

TenantNetwork = create_global_resource(GROUP, VERSION, KIND, PLURAL)
NetworkAttachmentDefinition = create_namespaced_resource(
    "k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition", "network-attachment-definitions")

WATCH_SECONDS = 240  # the server ends a watch after this; lightkube renews it from the last version


def client(kubeconfig: str = "", field_manager: str = "tenantnet") -> Client:
    """A client from a kubeconfig file, or the pod's ServiceAccount when none is named."""
    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_service_account()
    return Client(config=config, field_manager=field_manager)  # lightkube: 10 s a request


def as_dict(obj: Any) -> dict[str, Any]:
    """A lightkube object (generic or typed) as the API's JSON."""
    out = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
    assert isinstance(out, dict)
    return out
