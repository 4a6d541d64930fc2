"""The TLS context of every HTTP client the pipeline opens: one per process.

Building one loads the CA bundle (certifi), about 15 ms of CPU. httpx builds a new one for each client it
opens unless it is handed one, and a run opens clients for each shard step, each fleet probe and each plan
probe. The context is only read once built (certificates are verified against certifi's bundle, as
httpx does with `trust_env=False`), so clients on any thread or event loop can share it.
"""

from __future__ import annotations

import functools
import ssl

import certifi


@functools.cache
def tls_context() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=certifi.where())
