"""URLs: opening them the way a sidecar tool should (local services directly, never via a
proxy), and showing them without the credentials they may carry."""

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


def redacted_url(url: str) -> str:
    """`url` as it may be shown: the password of its user info replaced by `***`
    (`http://user:***@host:8083`), or the whole user info if it has no user name part
    (a bare token). Written by hand rather than with urlsplit, which refuses some strings
    a worker may send (a bad port, a bracket): those must be redacted too."""
    if "@" not in url:  # the usual worker URL: nothing to hide
        return url
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    end = len(rest)
    for delimiter in "/?#":
        found = rest.find(delimiter)
        if found != -1:
            end = min(end, found)
    authority, path = rest[:end], rest[end:]
    if "@" not in authority:
        return url
    userinfo, host = authority.rsplit("@", 1)
    user, colon, _secret = userinfo.partition(":")
    shown = f"{user}:***" if colon and user else "***"
    return f"{scheme}{sep}{shown}@{host}{path}"
