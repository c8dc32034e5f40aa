"""The client's address behind trusted proxies, from ``X-Forwarded-For``.

Only a peer that is a trusted proxy may name the client, and then the
address is the right-most hop that is not a trusted proxy: hops further left
were written by whoever sent the request and prove nothing.
"""

from __future__ import annotations

import ipaddress
from typing import Sequence, Tuple, Union

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]


def client_address(peer: str, forwarded_for: Sequence[str], trusted: Tuple[Network, ...]) -> str:
    """The client's address: the right-most hop that is not a trusted proxy."""
    if not trusted or not forwarded_for or not _is_trusted(peer, trusted):
        return peer
    hops = [hop.strip() for line in forwarded_for for hop in line.split(",") if hop.strip()]
    address = peer
    for hop in reversed(hops):
        if not _is_address(hop):
            break  # garbage from beyond the trusted hops: do not believe it
        address = hop
        if not _is_trusted(hop, trusted):
            break
    return address


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _is_trusted(text: str, trusted: Tuple[Network, ...]) -> bool:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return any(address in network for network in trusted)
