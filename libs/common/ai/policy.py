"""The output policy of an AI step: what a draft may not contain, whatever the model was told.

The prompt keeps the customer's words as data, but a model may still obey them. So a draft is checked
before it is queued, and one that breaks the policy is not sent: the step takes its fallback with reason
``ai_policy``. A draft breaks it when it

- names a host outside the step's ``allowed_domains`` (a domain or any of its subdomains). A host is
  anything a chat app would link: the host of a URL (``https://evil.example/x``, any scheme, an IP address
  too), or a bare name (``evil.example``, ``www.evil.example``, the domain of ``ops@evil.example``). A step
  that lists no domain allows no host at all: the default is that an AI step writes no link.
- repeats the value of a variable the step marks ``private`` (the model may see it, never echo it): the
  value's letters and digits, in any case, anywhere in the draft's letters and digits, so spacing or
  punctuation (``INTERNAL 50-off``) does not hide it. Every string or number inside the value counts
  (a nested object's too); an empty one, a boolean or a null is not a secret.

It is a guard against a model obeying an injected message, not a proof: a model can still spell a secret
out a letter per line. Give the model only what it needs (``variables``, ``contact_attributes``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

#: A host after a scheme (``https://``, ``ftp://``): up to the path, query, fragment or a space.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://([^\s/?#<>\"'()\[\]{}]*(?:\[[^\]\s]*\][^\s/?#<>\"']*)?)")
#: Dots as IDNA reads them (the ideographic and full-width ones too).
_DOT = "[.\u3002\uff0e\uff61]"
_LABEL = r"[^\W_](?:[\w-]{0,61}[^\W_])?"
#: A bare host name: labels, then a top-level label of letters (or an ``xn--`` one), not inside a word
#: (nor starting at a later label of a longer name: each name is tried once, in time linear in its length).
_NAME = re.compile(
    rf"(?<![\w-])(?<![^\W_]{_DOT})((?:{_LABEL}{_DOT})+(?:[^\W\d_]{{2,63}}|xn--[a-z0-9-]{{1,59}}))(?![\w-]|{_DOT}[^\W_])",
    re.IGNORECASE,
)
_NOT_ALNUM = re.compile(r"[\W_]+")

Rule = Literal["host", "private_variable"]


@dataclass(frozen=True)
class Violation:
    """Why a draft is not sent: the host it names, or the private variable it repeats (by name: never its
    value, which is what must not leak)."""

    rule: Rule
    detail: str


def check_draft(
    text: str, *, allowed_domains: list[str], private: list[str], variables: dict[str, Any]
) -> Violation | None:
    """The first rule ``text`` breaks, or None when it may be sent."""
    for host in hosts_in(text):
        if not host_allowed(host, allowed_domains):
            return Violation("host", host)
    written = _letters_and_digits(text)
    for name in private:
        if name in variables and any(secret in written for secret in _secrets(variables[name])):
            return Violation("private_variable", name)
    return None


def hosts_in(text: str) -> Iterator[str]:
    """Every host ``text`` names: URLs' hosts, then bare host names (lowercase, without a trailing dot)."""
    for match in _URL.finditer(text):
        try:
            host = urlsplit("//" + match.group(1)).hostname
        except ValueError:  # an unbalanced IPv6 bracket, an impossible port: still a link to somewhere
            host = match.group(1)
        if host:
            yield _normal(host)
    for match in _NAME.finditer(text):
        yield _normal(match.group(1))


def host_allowed(host: str, allowed_domains: list[str]) -> bool:
    """Whether ``host`` is one of the domains or a subdomain of one (an IP address never is)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    else:
        return False
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:  # not a name IDNA can encode: no allowed domain can be it
        return False
    return any(ascii_host == domain or ascii_host.endswith("." + domain) for domain in allowed_domains)


def _normal(host: str) -> str:
    return re.sub(_DOT, ".", host).lower().rstrip(".")


def _letters_and_digits(text: str) -> str:
    return _NOT_ALNUM.sub("", text).casefold()


def _secrets(value: Any) -> Iterator[str]:
    """The strings and numbers inside a variable's value, as letters and digits (empty ones left out)."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, dict):
        for item in value.values():
            yield from _secrets(item)
    elif isinstance(value, list):
        for item in value:
            yield from _secrets(item)
    elif secret := _letters_and_digits(str(value)):
        yield secret
