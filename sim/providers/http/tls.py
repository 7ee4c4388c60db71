"""The TLS context every HTTP client of the providers verifies with."""

from __future__ import annotations

import os
import ssl

import certifi

from sim.llm.errors import LLMConfigurationError

_SSL_CONTEXTS: dict[tuple[str | None, str | None], ssl.SSLContext] = {}


def _load_context() -> ssl.SSLContext:
    """A verifying context: ``SSL_CERT_FILE``, else ``SSL_CERT_DIR``, else the system's
    certificate store, else certifi's (a system without one, such as a slim container)."""
    cafile = os.environ.get("SSL_CERT_FILE") or None
    capath = os.environ.get("SSL_CERT_DIR") or None
    if cafile is not None:
        if not os.path.isfile(cafile):
            raise LLMConfigurationError(
                f"SSL_CERT_FILE is set to {cafile!r}, which is not a file: point it to a "
                "PEM file of the certificates to trust, or unset it to use the system's"
            )
        try:
            return ssl.create_default_context(cafile=cafile)
        except ssl.SSLError as exc:
            raise LLMConfigurationError(
                f"SSL_CERT_FILE ({cafile!r}) holds no certificate that can be read: {exc}"
            ) from exc
    if capath is not None:
        if not os.path.isdir(capath):
            raise LLMConfigurationError(
                f"SSL_CERT_DIR is set to {capath!r}, which is not a folder: point it to a "
                "folder of hashed certificates (c_rehash), or unset it to use the system's"
            )
        return ssl.create_default_context(capath=capath)
    context = ssl.create_default_context()
    if not context.cert_store_stats().get("x509_ca"):
        context.load_verify_locations(cafile=certifi.where())
    return context


def shared_ssl_context() -> ssl.SSLContext:
    """The verifying TLS context, made once per process and setting and shared by every
    client the adapters build: loading a certificate store costs ~30 ms, and a run makes
    a route per 16 connections.

    Raises:
        LLMConfigurationError: ``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` names nothing usable.
    """
    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    context = _SSL_CONTEXTS.get(key)
    if context is None:
        context = _SSL_CONTEXTS[key] = _load_context()
    return context
