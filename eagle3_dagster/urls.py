"""SGLang endpoint lists: the one parser, used where a list enters as text (EAGLE3_SGLANG_URL, the `sglang`
resource's `urls` field, a caller's string) and the one typed value it makes, `Endpoints`.

    parse_endpoint_urls("http://a:30000, http://b:30000/")  ->  Endpoints(("http://a:30000", "http://b:30000"))

An `Endpoints` is parsed already: handed on (settings -> resource -> GenerationConfig) it is never parsed again.

Comma-separated (or any iterable of) http(s)://host[:port][/path] URLs; blanks and trailing slashes
are dropped; anything else raises ValueError naming where the list came from and the bad entry
(without user info or query, where credentials could hide).
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import unquote, urlsplit

from .secret import register_secret


def redact_url(raw: str) -> str:
    """A URI without user info and query (where credentials could hide), for messages."""
    if "://" not in raw:
        return raw
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError:
        return raw.split("://", 1)[0] + "://<unparsable>"
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{':' + str(port) if port else ''}{parts.path}"


def has_credentials(url: str) -> bool:
    """Whether the URL carries a `user[:password]@` part (httpx would send it as Basic auth)."""
    try:
        p = urlsplit(url)
    except ValueError:
        return False
    return bool(p.username or p.password)


def credentials_conflict(urls: Iterable[str], source: str) -> str | None:
    """The settings problem of endpoint URLs with user info next to SGLANG_API_KEY, or None."""
    with_creds = [redact_url(u) for u in urls if has_credentials(u)]
    if not with_creds:
        return None
    return (
        f"{source} carries credentials (user:password@ in {', '.join(with_creds)}) and SGLANG_API_KEY is set: "
        "only one can be sent (the URL's user info becomes Basic auth and replaces the Bearer key); "
        f"drop the user info from {source} or unset SGLANG_API_KEY"
    )


class Endpoints(tuple[str, ...]):
    """Validated, normalized endpoint URLs (a tuple of str); made by `parse_endpoint_urls` only."""

    __slots__ = ()

    def as_text(self) -> str:
        """The comma-separated form a text field (the `sglang` resource's `urls`) holds."""
        return ",".join(self)


def parse_endpoint_urls(value: str | Iterable[str], *, source: str = "endpoint list") -> Endpoints:
    """The endpoint URLs in `value` (a comma-separated string or an iterable of URLs), normalized; an
    `Endpoints` is returned as it is (it was checked when it was made).

    Returns an empty Endpoints for an empty list (the caller decides whether that is an error).
    """
    if isinstance(value, Endpoints):
        return value
    items = value.split(",") if isinstance(value, str) else [u for v in value for u in str(v).split(",")]
    urls = tuple(u.strip().rstrip("/") for u in items if u and u.strip())
    for u in urls:
        try:
            parts = urlsplit(u)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port is None or parts.port > 0)
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"{source} must be comma-separated http(s)://host:port URLs, got {redact_url(u)!r}")
        if parts.password:
            register_secret(parts.password)  # redacted from any text this process stores or prints
            register_secret(unquote(parts.password))
    return Endpoints(urls)
