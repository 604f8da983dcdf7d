"""Who may open a WebSocket at all, before the token is looked at (PROTOCOL.md 9.8).

Every browser sends `Origin` on a WebSocket handshake, and a web page can neither leave it out
nor set an `Authorization` header; orchestrators send no `Origin`. So a handshake with an
`Origin` is a web page the user happens to have open, and it is refused (403) unless the
operator named that exact origin with `--allow-origin`: also under `--insecure-no-auth`, where
nothing else would stop the page from running commands.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit


class BadOrigin(ValueError):
    """An `--allow-origin` value that no browser would ever send."""


def refused_origin(headers: Iterable[tuple[bytes, bytes]], allowed: frozenset[str]) -> str | None:
    """The first `Origin` header value not in `allowed`, or None when none is refused.

    Compared exactly, as the browser serialises it (RFC 6454: scheme://host[:port], no path):
    no case folding or normalising, so an allowed origin cannot be matched by a look-alike."""
    for name, value in headers:
        if name.lower() == b"origin":
            origin = value.decode("latin-1").strip()
            if origin not in allowed:
                return origin
    return None


def check_allowed_origin(origin: str) -> str:
    """Validate one `--allow-origin` value; returns it unchanged or raises BadOrigin."""
    if origin == "null":
        # Sandboxed frames, file:// pages and redirects all send "null": allowing it would
        # allow any of them.
        raise BadOrigin("'null' is the origin of sandboxed and file pages; it cannot be allowed")
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BadOrigin(f"{origin!r} is not an origin like https://example.com[:port]")
    if origin != origin.lower():
        raise BadOrigin(f"{origin!r}: browsers send the scheme and host in lower case")
    if origin != f"{parts.scheme}://{parts.netloc}":
        raise BadOrigin(
            f"{origin!r} has a path, query or trailing slash; a browser sends only "
            f"{parts.scheme}://{parts.netloc}"
        )
    return origin
