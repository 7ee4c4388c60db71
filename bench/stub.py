"""The stub server for the HTTP benchmarks, plain or over TLS, in its own process::

    python -m bench.stub LATENCY [CERT KEY]

Prints ``stub server on URL`` on stderr once listening (as ``sim stub-server`` does), with
an ``https://`` URL when a certificate and key are given (``bench.tls``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

from bench.tls import SelfSigned
from sim.testing.stub_server import StubOptions, StubServer


def main() -> None:
    latency = float(sys.argv[1])
    tls = SelfSigned(Path(sys.argv[2]), Path(sys.argv[3])) if len(sys.argv) > 3 else None
    server = StubServer(StubOptions(latency=latency))

    async def serve() -> None:
        await server.start("127.0.0.1", 0, tls.server_context() if tls else None)
        print(f"stub server on {server.base_url}", file=sys.stderr, flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
