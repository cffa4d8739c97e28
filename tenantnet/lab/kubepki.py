"""The Kubernetes lab's certificates and kubeconfigs, made with Debian's `openssl` CLI.

A private CA (P-256, 30 days) signs every certificate the lab's components present: the API
server's serving certificate, its client certificate towards the kubelet, the kubelet's
client (`system:node:<node>` in `system:nodes`, for the Node authorizer) and serving ones,
the controller-manager's and scheduler's clients (the users RBAC's bootstrap policy binds),
the admin's (`system:masters`) and Multus's (bound to its own ClusterRole by the lab). The
service-account signing key is a P-256 key pair. All of it lives in `<lab>/pki/`, mode 0600
keys; nothing is trusted outside the lab.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tenantnet.lab.ovs import LabError

DAYS = "30"
# No distinguished-name prompts, no extensions from the system's openssl.cnf (Debian's would
# add CA:true to every `req -x509`): what each certificate carries is said below.
_REQ_CONFIG = "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = unused\n"


@dataclass(frozen=True)
class Cert:
    cert: str
    key: str


def _openssl(*args: str) -> None:
    try:
        proc = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise LabError("openssl is not installed (apt-get install openssl)") from None
    if proc.returncode != 0:
        raise LabError(f"openssl {args[0]}: {proc.stderr.strip()}")


class Pki:
    """The lab's CA in `directory`, and the certificates it signs."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = Cert(str(directory / "ca.crt"), str(directory / "ca.key"))
        self.sa_key, self.sa_pub = str(directory / "sa.key"), str(directory / "sa.pub")

    def create_ca(self) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        conf = self.dir / "openssl.cnf"
        conf.write_text(_REQ_CONFIG + "[ca]\nbasicConstraints = critical,CA:TRUE\n"
                        "keyUsage = critical,keyCertSign,cRLSign,digitalSignature\n"
                        "subjectKeyIdentifier = hash\n")
        _openssl("req", "-x509", "-new", "-config", str(conf), "-extensions", "ca", "-newkey", "ec",
                 "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", self.ca.key,
                 "-out", self.ca.cert, "-days", DAYS, "-subj", "/CN=tenantnet-lab-ca")
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", self.sa_key)
        _openssl("ec", "-in", self.sa_key, "-pubout", "-out", self.sa_pub)
        for key in (self.ca.key, self.sa_key):
            os.chmod(key, 0o600)

    def issue(self, name: str, cn: str, org: str | None = None, *, server: bool = False,
              sans: tuple[str, ...] = ()) -> Cert:
        """A certificate for `cn` (in group `org`), client auth, and server auth with `sans`."""
        out = Cert(str(self.dir / f"{name}.crt"), str(self.dir / f"{name}.key"))
        csr, ext = self.dir / f"{name}.csr", self.dir / f"{name}.ext"
        subject = (f"/O={org}" if org else "") + f"/CN={cn}"
        usages = "serverAuth,clientAuth" if server else "clientAuth"
        ext.write_text("[leaf]\nbasicConstraints = critical,CA:FALSE\n"
                       "keyUsage = critical,digitalSignature,keyEncipherment\n"
                       f"extendedKeyUsage = {usages}\n"
                       + (f"subjectAltName = {','.join(sans)}\n" if sans else ""))
        _openssl("req", "-new", "-config", str(self.dir / "openssl.cnf"), "-newkey", "ec",
                 "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", out.key,
                 "-out", str(csr), "-subj", subject)
        _openssl("x509", "-req", "-in", str(csr), "-CA", self.ca.cert, "-CAkey", self.ca.key,
                 "-CAcreateserial", "-days", DAYS, "-out", out.cert, "-extfile", str(ext),
                 "-extensions", "leaf")
        os.chmod(out.key, 0o600)
        csr.unlink()
        ext.unlink()
        return out


def write_kubeconfig(path: Path, server: str, ca: str, client: Cert, user: str) -> str:
    """A kubeconfig for `user` at `server`, naming the files (not embedding them)."""
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: lab\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n"
        f"users:\n- name: {user}\n  user:\n    client-certificate: {client.cert}\n"
        f"    client-key: {client.key}\n"
        f"contexts:\n- name: lab\n  context:\n    cluster: lab\n    user: {user}\n"
        "current-context: lab\n")
    os.chmod(path, 0o600)
    return str(path)
