"""Credentials written into a URL, hidden wherever sim prints or stores the URL.

A ``base_url`` may carry a secret: a user and password (``http://user:pw@host/v1``) or a
key in its query (``?api-key=...``, ``?key=...``, ``?token=...``). ``redact_url`` is the
one function that hides them; every boundary where a URL leaves the process (``sim
check``, the tick log, ``sim usage --by endpoint``, error messages) passes it through
``redact_url``, or a text that may hold one through ``redact_text``. The host, port, path
and the other query parameters are kept, so two servers stay told apart.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

#: what stands where a secret was
MASK = "***"

#: a query parameter whose value is a credential: its name holds one of these (case, ``-``
#: and ``_`` ignored: ``api-key``, ``apiKey``, ``access_token``, ``X-Amz-Signature``)
_SECRET_NAME = re.compile(r"key|token|secret|passw|pwd|auth|sig|credential|session", re.I)

#: a URL inside a text: a scheme, ``://`` and what follows up to a space or a quote
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")


def _secret(name: str) -> bool:
    return bool(_SECRET_NAME.search(name.replace("-", "").replace("_", "")))


def redact_url(url: str) -> str:
    """``url`` with its user, password and credential query values replaced by ``***``.

    A URL without any of them comes back unchanged (byte for byte), and so does a text
    that is not a URL.
    """
    try:
        parts = urlsplit(url)
    except ValueError:  # an unbalanced bracket in the host: no URL to take apart
        return _URL_USERINFO.sub(rf"\g<1>{MASK}@", url)
    netloc, query = parts.netloc, parts.query
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rpartition('@')[2]}"
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_secret(name) for name, _ in pairs):
            query = "&".join(
                f"{quote(name, safe='')}={MASK if _secret(name) else quote(value, safe='')}"
                for name, value in pairs
            )
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


#: ``scheme://user:pw@`` in a string ``urlsplit`` cannot parse
_URL_USERINFO = re.compile(r"(\w[\w+.-]*://)[^/@\s]*@")


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (``redact_url``): for messages that may quote
    a URL (an error naming the server it could not reach)."""
    if "://" not in text:
        return text
    return _URL.sub(lambda match: redact_url(match.group(0)), text)


def redact_urls(value: str | tuple[str, ...]) -> str | tuple[str, ...]:
    """A ``base_url`` (one URL or a pool's) redacted."""
    if isinstance(value, tuple):
        return tuple(redact_url(url) for url in value)
    return redact_url(value)
