"""A throw-away PKI for a loopback cluster: a CA, serving and client certificates, a service-account key pair."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpupack.errors import GpupackError
from gpupack.harness.kube_programs import MissingBinary

SERVING_EXTENSIONS = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
CLIENT_EXTENSIONS = "extendedKeyUsage=clientAuth\n"


class CertificateError(GpupackError, RuntimeError):
    """openssl refused to make a key or certificate."""


@dataclass(frozen=True)
class Certificates:
    """PEM files for kube-apiserver and its admin client."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    service_account_key: Path
    service_account_pub: Path


def make_certificates(folder: Path) -> Certificates:
    """A CA, a serving cert for 127.0.0.1, an admin client cert (system:masters) and a SA key pair."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = folder / "ca.crt", folder / "ca.key"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=gpupack-e2e-ca",
            "-keyout", str(ca_key), "-out", str(ca_cert))  # fmt: skip
    serving_key, serving_cert = issue_certificate(
        folder, "apiserver", "/CN=kube-apiserver", SERVING_EXTENSIONS, ca_cert, ca_key
    )
    admin_key, admin_cert = issue_certificate(
        folder, "admin", "/O=system:masters/CN=admin", CLIENT_EXTENSIONS, ca_cert, ca_key
    )
    sa_key, sa_pub = folder / "sa.key", folder / "sa.pub"
    openssl("genrsa", "-out", str(sa_key), "2048")
    openssl("rsa", "-in", str(sa_key), "-pubout", "-out", str(sa_pub))
    return Certificates(ca_cert, ca_key, serving_cert, serving_key, admin_cert, admin_key, sa_key, sa_pub)


def issue_certificate(
    folder: Path, name: str, subject: str, extensions: str, ca_cert: Path, ca_key: Path
) -> tuple[Path, Path]:
    """A new key `name.key` and certificate `name.crt` for `subject`, signed by the CA; their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    key, cert, request, ext = (folder / f"{name}.{suffix}" for suffix in ("key", "crt", "csr", "ext"))
    ext.write_text(extensions)
    openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(key), "-out", str(request))
    openssl("x509", "-req", "-in", str(request), "-CA", str(ca_cert), "-CAkey", str(ca_key),
            "-CAserial", str(folder / "ca.srl"), "-CAcreateserial", "-days", "2", "-extfile", str(ext),
            "-out", str(cert))  # fmt: skip
    request.unlink()
    return key, cert


def openssl(*args: str) -> None:
    """Run openssl; CertificateError with its output when it fails."""
    if shutil.which("openssl") is None:
        raise MissingBinary("openssl is not on PATH (apt-get install -y openssl)")
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CertificateError(f"openssl {args[0]} failed: {done.stderr.strip()}")
