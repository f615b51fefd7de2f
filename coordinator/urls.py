"""Opening URLs the way a sidecar tool should: local services directly, never via a proxy."""

from __future__ import annotations

import urllib.parse
import urllib.request
from typing import Any

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def open_url(url: str | urllib.request.Request, timeout: float) -> Any:
    """`urlopen`, except that a coordinator or Prometheus on this machine is reached
    directly, whatever http_proxy says."""
    target = url.full_url if isinstance(url, urllib.request.Request) else url
    if urllib.parse.urlsplit(target).hostname in _LOOPBACK_HOSTS:
        return _DIRECT.open(url, timeout=timeout)
    return urllib.request.urlopen(url, timeout=timeout)
