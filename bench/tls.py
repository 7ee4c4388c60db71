"""A self-signed certificate for 127.0.0.1, made at bench (or test) time with the
``openssl`` command, so the stub server can serve ``https://`` on loopback.

Bench and test only: nothing in ``sim`` needs it.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SelfSigned:
    """A certificate and its key, PEM files; the certificate is its own CA."""

    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context

    def client_context(self) -> ssl.SSLContext:
        """A verifying client context that trusts this certificate only."""
        return ssl.create_default_context(cafile=str(self.cert))


def self_signed(folder: Path) -> SelfSigned:
    """Write ``cert.pem`` and ``key.pem`` (P-256, one day, for 127.0.0.1 and localhost).

    Raises:
        RuntimeError: the ``openssl`` command is missing or failed.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the https benchmark needs the openssl command")
    cert, key = folder / "cert.pem", folder / "key.pem"
    proc = subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
            "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"openssl could not make a certificate: {proc.stderr.strip()}")
    return SelfSigned(cert, key)
