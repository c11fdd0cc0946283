"""Where a webhook may go, and the one HTTP POST that goes there, bounded by one deadline.

**Addresses.** A webhook never reaches the service's own network: loopback, private (RFC 1918), carrier-grade
NAT (100.64.0.0/10), link-local (169.254.0.0/16 with the cloud metadata address, fe80::/10), unique-local
(fc00::/7), multicast, unspecified, reserved and every other non-global range are denied, and so are the
IPv6 forms that embed such an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible ``::a.b.c.d``,
NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``). Numeric host spellings are normalised first, as a resolver
would read them (``2130706433``, ``0x7f000001``, ``127.1``, ``0177.0.0.1`` are all 127.0.0.1). The operator
opens ranges with ``WEBHOOK_ALLOWED_NETWORKS`` (:func:`configure`, at process start).

A literal denied address is refused when the rule is saved (:func:`check_literal`). A name is resolved once
per attempt, every address it resolves to is checked, and the connection goes to an address that passed:
no second lookup, so no DNS-rebinding window. The Host header and TLS (SNI and the certificate's check)
use the URL's name.

**The POST** (:func:`post`): one deadline covers the name's lookup, connect, send and the response's status
line and headers (at most :data:`MAX_HEAD_BYTES`); a peer that drips bytes is cut at the deadline. Its
result is a status code or an error *class* (:data:`ErrorClass`), never bytes of the peer's answer.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import SplitResult, quote, urlsplit

from libs.common.core.settings import parse_networks

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: What a failed attempt records (besides ``http_<status>``): a class, never the peer's bytes.
ErrorClass = Literal[
    "blocked_address", "dns_error", "connect_refused", "connect_error", "timeout", "tls_error", "bad_response"
]

#: Longest status line and headers read from a response.
MAX_HEAD_BYTES: Final = 16_384

#: Ranges denied whatever ``ipaddress`` says of them (some are not flagged by every Python version).
_DENIED: Final[tuple[Network, ...]] = tuple(
    ipaddress.ip_network(cidr)
    for cidr in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "::/128",
        "::1/128",
        "fc00::/7",
        "fe80::/10",
        "ff00::/8",
    )
)
_NAT64: Final = ipaddress.ip_network("64:ff9b::/96")
_SIX_TO_FOUR: Final = ipaddress.ip_network("2002::/16")

#: The networks the operator opened (``WEBHOOK_ALLOWED_NETWORKS``); none by default.
_allowed: tuple[Network, ...] = ()

#: Resolves a host name to its addresses (a seam: a test resolves a name to what it likes).
Resolver = Callable[[str, int], Sequence[str]]


def configure(allowed_networks: str | Iterable[Network]) -> None:
    """Open these networks to webhooks in this process (the composition root calls it with the setting)."""
    global _allowed
    if isinstance(allowed_networks, str):
        _allowed = parse_networks(allowed_networks)
    else:
        _allowed = tuple(allowed_networks)


def allowed_networks() -> tuple[Network, ...]:
    return _allowed


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, compatible, NAT64, 6to4), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    value = int(address)
    if value >> 32 == 0 and value > 1:  # ::a.b.c.d (IPv4-compatible; :: and ::1 are themselves)
        return ipaddress.IPv4Address(value)
    if address in _NAT64:
        return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    return None


def is_denied(address: IPAddress) -> bool:
    """Whether a webhook may not go to ``address`` (not opened by the operator and not a global one)."""
    if any(address in network for network in _allowed if network.version == address.version):
        return False
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id:
            return True
        embedded = _embedded_v4(address)
        if embedded is not None:
            return is_denied(embedded)
    if any(address in network for network in _DENIED if network.version == address.version):
        return True
    return not address.is_global or address.is_multicast


_DECIMAL_PART = re.compile(r"^(0x[0-9a-f]*|0[0-7]*|[1-9][0-9]*)$")


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` spells, normalised as a resolver reads numbers (``127.1``, ``0x7f000001``,
    ``2130706433``, ``0177.0.0.1``, ``::ffff:127.0.0.1``), or None for a name."""
    host = host.strip().rstrip(".").lower()
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]) if ":" in host else ipaddress.ip_address(host)
    except ValueError:
        pass
    parts = host.split(".")
    if not host or len(parts) > 4 or not all(_DECIMAL_PART.match(part) for part in parts):
        return None
    try:
        numbers = [_number(part) for part in parts]
    except ValueError:  # "0x" alone
        return None
    *leading, last = numbers
    if any(n > 255 for n in leading) or last >= 256 ** (5 - len(parts)):
        return None
    value = 0
    for n in leading:
        value = value << 8 | n
    value = value << 8 * (5 - len(parts)) | last
    return ipaddress.IPv4Address(value)


def _number(part: str) -> int:
    if part.startswith("0x"):
        return int(part, 16)
    return int(part, 8) if part.startswith("0") and len(part) > 1 else int(part)


def check_literal(url: str) -> str | None:
    """Why ``url``'s host may not be sent to, when it is a literal address (``blocked_address``), else None
    (a name is checked when each attempt resolves it)."""
    host = urlsplit(url).hostname or ""
    address = literal_address(host)
    return "blocked_address" if address is not None and is_denied(address) else None


def system_resolver(host: str, port: int) -> Sequence[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return [str(info[4][0]) for info in infos]


#: Where names are resolved, so a lookup that hangs is given up at the attempt's deadline (the resolver's
#: own timeout ends its thread).
_LOOKUPS: Final = ThreadPoolExecutor(max_workers=8, thread_name_prefix="webhook-lookups")


class _Blocked(Exception):
    pass


@dataclass(frozen=True)
class Response:
    """What one POST came to: a status code, or an error class."""

    status_code: int | None = None
    error: ErrorClass | None = None


def _target(parts: SplitResult, resolve: Resolver, deadline: float) -> IPAddress:
    """The one address to connect to: resolved once (within the deadline), each address checked."""
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    literal = literal_address(host)
    if literal is not None:
        candidates: list[IPAddress] = [literal]
    else:
        answer = _LOOKUPS.submit(resolve, host, port).result(timeout=_remaining(deadline))
        candidates = [ipaddress.ip_address(found.split("%", 1)[0]) for found in answer]
    for address in candidates:
        if not is_denied(address):
            return address
    raise _Blocked


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _host_header(parts: SplitResult) -> str:
    host = _ascii_host(parts.hostname or "")
    shown = f"[{host}]" if ":" in host else host
    default = 443 if parts.scheme == "https" else 80
    return shown if parts.port in (None, default) else f"{shown}:{parts.port}"


#: What a request target keeps as it is (anything else, a non-ASCII character, is percent-encoded).
_PATH_SAFE: Final = "/?&=;:@!$'()*+,~%-._[]"


def _ascii_host(host: str) -> str:
    """An international name as its ASCII (IDNA) form, for the Host header and TLS."""
    return host if host.isascii() else host.encode("idna").decode("ascii")


_STATUS_LINE = re.compile(rb"^HTTP/1\.[01] ([1-5][0-9]{2})(?: [\x20-\x7e\t]*)?$")


def _read_status(sock: socket.socket, deadline: float) -> int | None:
    """The status code of the response's head (None: not a well-formed HTTP/1.x response head)."""
    head = b""
    while b"\r\n\r\n" not in head:
        if len(head) > MAX_HEAD_BYTES:
            return None
        sock.settimeout(_remaining(deadline))
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    line = head.split(b"\r\n", 1)[0]
    match = _STATUS_LINE.match(line) if b"\r\n" in head else None
    return int(match.group(1)) if match else None


def post(
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    timeout_s: float,
    resolve: Resolver = system_resolver,
) -> Response:
    """POST ``body`` to ``url`` within ``timeout_s`` overall, to a checked address only."""
    deadline = time.monotonic() + timeout_s
    parts = urlsplit(url)
    try:
        address = _target(parts, resolve, deadline)
    except _Blocked:
        return Response(error="blocked_address")
    except TimeoutError:
        return Response(error="timeout")
    except (OSError, UnicodeError, ValueError):
        return Response(error="dns_error")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), safe=_PATH_SAFE)
    lines = [f"POST {path} HTTP/1.1", f"Host: {_host_header(parts)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines += [f"Content-Length: {len(body)}", "Connection: close"]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    sock: socket.socket | None = None
    try:
        sock = socket.create_connection((str(address), port), timeout=_remaining(deadline))
        if parts.scheme == "https":
            context = ssl.create_default_context()
            sock.settimeout(_remaining(deadline))
            sock = context.wrap_socket(sock, server_hostname=_ascii_host(parts.hostname or ""))
        sock.settimeout(_remaining(deadline))
        sock.sendall(request)
        code = _read_status(sock, deadline)
    except TimeoutError:
        return Response(error="timeout")
    except ConnectionRefusedError:
        return Response(error="connect_refused")
    except (ssl.SSLError, ssl.CertificateError):
        return Response(error="tls_error")
    except OSError:
        return Response(error="connect_error")
    finally:
        if sock is not None:
            sock.close()
    return Response(status_code=code) if code is not None else Response(error="bad_response")
