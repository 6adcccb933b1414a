"""The address a request comes from, given how many trusted reverse proxies stand in front of the server.

Behind a reverse proxy every request arrives from the proxy's address, so a limit per client address becomes one
limit for all clients together. A proxy appends the address it saw to `X-Forwarded-For`; entries further left are
whatever the client sent, so only the entries the trusted proxies appended count: with `proxy_hops` proxies, the
client address is the entry `proxy_hops` places from the right (the one the outermost proxy appended).

    client_address("10.0.0.1", "6.6.6.6, 203.0.113.1", proxy_hops=1)  # -> "203.0.113.1"
    client_address("10.0.0.1", "6.6.6.6, 203.0.113.1", proxy_hops=0)  # -> "10.0.0.1" (the header is words)

One setting says which proxies to trust: `SQLENV_PROXY_HOPS` (how many append to the header), or uvicorn's own
`FORWARDED_ALLOW_IPS` (their addresses; uvicorn then rewrites the peer itself). Both at once are refused
(`proxy_hops_setting`). With neither, a proxy is trusted only where the platform says one is in front: on a
HuggingFace Space (`SPACE_ID` set and `SYSTEM=spaces`, as every Space's environment has) one hop, elsewhere none
(issue 59: the image once set `SQLENV_PROXY_HOPS=1` everywhere, and with no proxy in front one TCP address named
64 addresses by the header and took 64 of 64 sessions). `address_source` says in one line which source a server
uses, for its start log.

Every per-client limit counts by `client_key` (the address, an IPv6 one as its /64: the block one host is given,
so a new address from it each try is still the same client): the OpenEnv server's sessions per client, and the
dashboard's login throttle, Play episodes and steps, and connections (`address_block` of the TCP peer). One
function, so a spelling that one limit reads as a new client no other limit does either. Standard library only.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["PROXY_HOPS_ENV", "FORWARDED_ALLOW_IPS_ENV", "MAX_ADDRESS_CHARS", "address_block", "address_source",
           "client_address", "client_key", "forwarded_for", "on_space", "proxy_hops_setting"]

#: Reverse proxies in front of the server whose `X-Forwarded-For` entries are trusted (0: none, the TCP peer
#: is the client).
PROXY_HOPS_ENV = "SQLENV_PROXY_HOPS"
#: uvicorn's list of proxy addresses whose `X-Forwarded-For` it believes (rewriting the request's client).
FORWARDED_ALLOW_IPS_ENV = "FORWARDED_ALLOW_IPS"
#: The longest address kept: an entry is the client's text when a proxy passes a malformed header on.
MAX_ADDRESS_CHARS = 64
#: Entries read from the right of the header: more hops than this are not a real deployment.
_MAX_ENTRIES = 64


def client_address(peer: str | None, forwarded_for: str | None, proxy_hops: int = 0) -> str:
    """The address a request comes from.

    Args:
        peer: the TCP peer the ASGI server reports (`scope["client"][0]`).
        forwarded_for: the request's `X-Forwarded-For` (several header lines joined with ",", in order:
            `forwarded_for(headers)`), or None.
        proxy_hops: trusted proxies that each append one entry to the header (default 0: the header is ignored).
            Set it to the number of proxies in front of the server, never more: one more and the entry read is
            the client's own claim. Too few is safe (clients then share a proxy's address).

    Returns:
        the entry `proxy_hops` places from the right of the header; the peer when `proxy_hops` is 0 or the
        header has fewer entries (the request did not come through the proxies); "unknown" when there is
        neither. At most `MAX_ADDRESS_CHARS` characters.
    """
    if proxy_hops and forwarded_for:
        # Split from the right only: a long header costs no more than its last entries.
        entries = [e.strip() for e in forwarded_for.rsplit(",", _MAX_ENTRIES)[-_MAX_ENTRIES:] if e.strip()]
        if len(entries) >= proxy_hops:
            return entries[-proxy_hops][:MAX_ADDRESS_CHARS]
    return (peer or "unknown")[:MAX_ADDRESS_CHARS]


def address_block(address: str) -> str:
    """The block of addresses one client holds: an IPv6 address's /64 (a host is given a whole /64, and may take a
    new address from it for every request), an IPv4-mapped IPv6 address's IPv4 address, any other address as it is
    (text that is no address, such as "unknown", too)."""
    try:
        parsed = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return address
    if parsed.version == 6:
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)


def client_key(scope: Mapping[str, Any], proxy_hops: int = 0) -> str:
    """Who an ASGI request or WebSocket (`scope`) comes from, for every per-client limit: `address_block` of
    `client_address` of its TCP peer and, behind `proxy_hops` trusted proxies, of all its `X-Forwarded-For` lines
    (`forwarded_for`: a client's own line and its proxy's read as one list)."""
    peer = (scope.get("client") or (None, 0))[0]
    header = forwarded_for(scope.get("headers") or ()) if proxy_hops else None
    return address_block(client_address(peer, header, proxy_hops))


def forwarded_for(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """Every `X-Forwarded-For` line of an ASGI scope's `headers`, joined with "," in order (a proxy may add a
    line of its own rather than append to the client's: both spell the same list), or None when there is none."""
    lines = [value.decode("latin-1") for name, value in headers if name.lower() == b"x-forwarded-for"]
    return ",".join(lines) if lines else None


def on_space(env: Mapping[str, str] | None = None) -> bool:
    """Whether the process runs on a HuggingFace Space, as the Space's own environment says (`SPACE_ID` set and
    `SYSTEM=spaces`, the test Gradio makes too): every request then comes through HF's reverse proxy."""
    env = os.environ if env is None else env
    return bool((env.get("SPACE_ID") or "").strip()) and (env.get("SYSTEM") or "").strip() == "spaces"


def proxy_hops_setting(hops: int | None = None, env: Mapping[str, str] | None = None,
                       name: str = PROXY_HOPS_ENV) -> int:
    """The number of trusted proxy hops, checked once at start.

    Args:
        hops: the value given on a command line (None: read `SQLENV_PROXY_HOPS`; unset or empty: 1 on a Space
            (`on_space`) unless `FORWARDED_ALLOW_IPS` names the proxies, else 0).
        env: the environment (default `os.environ`).
        name: how the error names the hops setting (default the variable; a command line names its flag).

    Raises:
        ValueError (one line): `SQLENV_PROXY_HOPS` is not a non-negative integer, or hops and
        `FORWARDED_ALLOW_IPS` are both set (two settings that could disagree on which proxies to trust).
    """
    env = os.environ if env is None else env
    if hops is None:
        text = (env.get(PROXY_HOPS_ENV) or "").strip()
        if not text:  # only the platform's word puts a proxy in front
            text = "1" if on_space(env) and not (env.get(FORWARDED_ALLOW_IPS_ENV) or "").strip() else "0"
        if not text.isdigit():
            raise ValueError(f"{PROXY_HOPS_ENV} must be a non-negative integer, got {text!r}")
        hops = int(text)
    if not isinstance(hops, int) or isinstance(hops, bool) or hops < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {hops!r}")
    if hops and (env.get(FORWARDED_ALLOW_IPS_ENV) or "").strip():
        raise ValueError(f"{name} and {FORWARDED_ALLOW_IPS_ENV} both say which proxies to trust: set one "
                         f"({name}: how many proxies append to X-Forwarded-For; "
                         f"{FORWARDED_ALLOW_IPS_ENV}: uvicorn's list of their addresses)")
    return hops


def address_source(hops: int, env: Mapping[str, str] | None = None) -> str:
    """One line saying where a server's client addresses come from, for its start log: `hops` trusted proxy hops
    (as `proxy_hops_setting` gave them) and what set them, uvicorn's `FORWARDED_ALLOW_IPS`, or the TCP peer."""
    env = os.environ if env is None else env
    allowed = (env.get(FORWARDED_ALLOW_IPS_ENV) or "").strip()
    if hops:
        named = (env.get(PROXY_HOPS_ENV) or "").strip()
        why = (f"{PROXY_HOPS_ENV}={named}" if named == str(hops) else
               "a HuggingFace Space (SPACE_ID, SYSTEM=spaces): its proxy is in front" if not named and on_space(env)
               else "--proxy-hops")
        return (f"client addresses: the X-Forwarded-For entry {hops} trusted proxy hop(s) appended ({why}); "
                "set SQLENV_PROXY_HOPS=0 if no proxy is in front")
    if allowed:
        return (f"client addresses: uvicorn's {FORWARDED_ALLOW_IPS_ENV}={allowed[:MAX_ADDRESS_CHARS]} "
                "(X-Forwarded-For believed from those proxy addresses only)")
    return ("client addresses: the TCP peer (no trusted proxy: not on a HuggingFace Space and neither "
            f"{PROXY_HOPS_ENV} nor {FORWARDED_ALLOW_IPS_ENV} set; X-Forwarded-For is ignored)")
