"""The ``format`` values a collection schema asserts, each one plain function.

Draft 2020-12 makes ``format`` an annotation unless a validator chooses to
assert it; Jetway asserts these nine, the same functions whatever validator
runs (``cache.schemas.schema``), so every path agrees on what a valid email is:
``date-time``, ``date``, ``time`` (RFC 3339, leap seconds only at 23:59:60
UTC), ``email`` (RFC 5321 mailbox: dot-atom or quoted local part, a host
name or an address literal), ``uri`` (RFC 3986, absolute), ``uuid``,
``ipv4``, ``ipv6`` (no zone) and ``hostname`` (RFC 1123 labels; an IDNA
A-label is checked for its syntax, not decoded). Any other format is an
annotation and is not checked. Only strings are checked: a format says
nothing about other types. Digits are ASCII (``re``'s ``\\d`` is not).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Callable, Dict

_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})\Z")
_TIME = re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.[0-9]+)?(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))\Z")
_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")
_IPV4 = re.compile(
    r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\Z"
)
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\Z")
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LOCAL = re.compile(rf'(?:{_ATOM}(?:\.{_ATOM})*|"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\[\x20-\x7e])*")\Z')
# RFC 3986: scheme ":" hier-part [ "?" query ] [ "#" fragment ], by character classes.
_UNRESERVED = r"A-Za-z0-9\-._~"
_SUB_DELIMS = r"!$&'()*+,;="
_PCT = r"%[0-9A-Fa-f]{2}"
_PCHAR = rf"(?:[{_UNRESERVED}{_SUB_DELIMS}:@]|{_PCT})"
_URI = re.compile(
    rf"[A-Za-z][A-Za-z0-9+.\-]*:"
    rf"(?://(?:(?:[{_UNRESERVED}{_SUB_DELIMS}:]|{_PCT})*@)?"
    rf"(\[[0-9A-Fa-f:.vV{_UNRESERVED}{_SUB_DELIMS}]*\]|(?:[{_UNRESERVED}{_SUB_DELIMS}]|{_PCT})*)"
    rf"(?::[0-9]*)?(?:/{_PCHAR}*)*"
    rf"|/?(?:{_PCHAR}+(?:/{_PCHAR}*)*)?)"
    rf"(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?\Z"
)


def is_date(text: str) -> bool:
    match = _DATE.match(text)
    if not match:
        return False
    year, month, day = (int(part) for part in match.groups())
    if not 1 <= month <= 12 or day < 1:
        return False
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return day <= (_DAYS[month - 1] if month != 2 or leap else 28)


def is_time(text: str) -> bool:
    match = _TIME.match(text)
    if not match:
        return False
    hour, minute, second = int(match.group(1)), int(match.group(2)), int(match.group(3))
    sign, offset_hour, offset_minute = match.group(4), match.group(5), match.group(6)
    offset = 0
    if sign:
        if int(offset_hour) > 23 or int(offset_minute) > 59:
            return False
        offset = (int(offset_hour) * 60 + int(offset_minute)) * (1 if sign == "+" else -1)
    if hour > 23 or minute > 59 or second > 60:
        return False
    if second == 60:
        # A leap second is 23:59:60 in UTC, whatever the offset it is written in.
        return (hour * 60 + minute - offset) % 1440 == 23 * 60 + 59
    return True


def is_date_time(text: str) -> bool:
    date, separator, time = text.partition("T") if "T" in text else text.partition("t")
    return bool(separator) and is_date(date) and is_time(time)


def is_ipv4(text: str) -> bool:
    return _IPV4.match(text) is not None


def is_ipv6(text: str) -> bool:
    if "%" in text or not text.isascii():  # no zone id; ipaddress would take one
        return False
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def is_hostname(text: str) -> bool:
    if not text or len(text) > 253 or not text.isascii():
        return False
    return all(_LABEL.match(label) and not _bad_a_label(label) for label in text.split("."))


def _bad_a_label(label: str) -> bool:
    # "--" in the third and fourth places is reserved for IDNA A-labels ("xn--").
    return label[2:4] == "--" and (label[:2].lower() != "xn" or len(label) < 5)


def is_email(text: str) -> bool:
    local, at, domain = text.rpartition("@")
    if not at or not local or not domain or not _LOCAL.match(local):
        return False
    if domain.startswith("[") and domain.endswith("]"):
        literal = domain[1:-1]
        return is_ipv6(literal[5:]) if literal.startswith("IPv6:") else is_ipv4(literal)
    return is_hostname(domain)


def is_uri(text: str) -> bool:
    match = _URI.match(text)
    if not match:
        return False
    host = match.group(1) or ""
    return not host.startswith("[") or is_ipv6(host[1:-1]) or host[1:2] in ("v", "V")


def is_uuid(text: str) -> bool:
    return _UUID.match(text) is not None


CHECKED: Dict[str, Callable[[str], bool]] = {
    "date-time": is_date_time,
    "date": is_date,
    "time": is_time,
    "email": is_email,
    "uri": is_uri,
    "uuid": is_uuid,
    "ipv4": is_ipv4,
    "ipv6": is_ipv6,
    "hostname": is_hostname,
}
