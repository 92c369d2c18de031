"""A URL as it may be shown or written: without its user:password@ and its query (a presigned
signature), alone (`redact_url`) or wherever one sits in a text (`redact_text`). The one rule, below
every module that shows a URL (publish.py applies it to what is written; remote.py to clients' error
texts)."""
from __future__ import annotations

import re

# The userinfo ends at the LAST "@" before the path (a password may hold an unencoded "@").
_USERINFO = re.compile(r"^([a-z0-9+.-]+://)[^/?#]*@", re.I)


def redact_url(url: str) -> str:
    """A URL as it may be shown: no user:password@ and no query string (presigned signatures)."""
    url = _USERINFO.sub(r"\1<hidden>@", url)
    return url.split("?", 1)[0] + ("?<hidden>" if "?" in url else "")


# A URL inside text: its scheme, then up to the first character that cannot be in one unquoted
# (whitespace, quotes, angle brackets, parentheses): JSON strings, HTML attributes and error texts.
_URL_IN_TEXT = re.compile(r"[a-z][a-z0-9+.-]*://[^\s'\"<>()]+", re.I)


def redact_text(text: str) -> str:
    """`text` with every URL in it as remote.redact_url shows it."""
    if "://" not in text:
        return text

    def one(m) -> str:
        url = m.group(0)
        # "...?" cut off by "<hidden>": already redacted (the rule is applied to text more than once)
        return url if url.endswith("?") and text.startswith("<hidden>", m.end()) else redact_url(url)
    return _URL_IN_TEXT.sub(one, text)
