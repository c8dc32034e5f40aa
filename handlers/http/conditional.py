"""Conditional requests answered from the validators stored with each document.

RFC 9110 section 13: ``If-None-Match`` is weighed first and, when it is
absent, ``If-Modified-Since`` (reads only); ``If-Match`` first and, when it
is absent, ``If-Unmodified-Since`` (writes; the store applies it against
the document it is about to change, ``cache.documents.store.Conditions``). A date
that is not a valid HTTP-date, or looks like a list of dates, is ignored,
as the RFC requires. Any variant's tag matches a document
(``cache.documents.variants.base_tag``), so a client that cached the gzip variant
revalidates it as well as one that cached the stored bytes.
"""

from __future__ import annotations

import calendar
import datetime
import re
from typing import Optional

from cache.documents.variants import base_tag

_MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
_MONTH_NUMBER = {name: number for number, name in enumerate(_MONTHS.split("|"), start=1)}
# RFC 9110 5.6.7: IMF-fixdate, and the two obsolete forms a recipient must accept.
_IMF_FIXDATE = re.compile(rf"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\d\d) ({_MONTHS}) (\d{{4}}) (\d\d):(\d\d):(\d\d) GMT\Z")
_RFC850 = re.compile(
    rf"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), (\d\d)-({_MONTHS})-(\d\d)"
    r" (\d\d):(\d\d):(\d\d) GMT\Z"
)
_ASCTIME = re.compile(rf"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ({_MONTHS}) ([ \d]\d) (\d\d):(\d\d):(\d\d) (\d{{4}})\Z")


def http_date(text: Optional[str]) -> Optional[int]:
    """Seconds since the epoch of an HTTP-date, or None if ``text`` is not one."""
    if not text:
        return None
    text = text.strip()
    match = _IMF_FIXDATE.match(text)
    if match:
        day, month, year, hour, minute, second = match.groups()
    else:
        match = _RFC850.match(text)
        if match:
            day, month, short_year, hour, minute, second = match.groups()
            year = str(1900 + int(short_year) if int(short_year) >= 70 else 2000 + int(short_year))
        else:
            match = _ASCTIME.match(text)
            if not match:
                return None
            month, day, hour, minute, second, year = match.groups()
    try:
        moment = datetime.datetime(int(year), _MONTH_NUMBER[month], int(day), int(hour), int(minute), int(second))
    except ValueError:
        return None  # 31 Feb, hour 25, ...
    return calendar.timegm(moment.timetuple())


def matching_tag(if_none_match: bytes, etag: bytes, selected: bytes) -> Optional[bytes]:
    """The tag of ``If-None-Match`` (as ``validation.entity_tags`` gives it) naming the document, if any.

    ``etag`` is the document's own tag, ``selected`` the tag of the variant
    chosen for this request; ``*`` matches any document and is answered
    with ``selected``.
    """
    if if_none_match == b"*":
        return selected
    for tag in if_none_match.split():
        if base_tag(tag) == etag:
            return tag
    return None


def modified_since(last_modified: bytes, if_modified_since: Optional[str]) -> bool:
    """False when ``If-Modified-Since`` holds a valid date no earlier than ``last_modified``."""
    since = http_date(if_modified_since)
    if since is None:
        return True
    modified = http_date(last_modified.decode("latin-1"))
    return modified is None or modified > since
