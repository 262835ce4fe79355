"""The `format` checks parley's validator runs itself, whatever optional packages are installed.

`jsonschema` checks most formats only with an add-on installed (`date-time` and `time` with
rfc3339-validator, `duration` with isoduration, `uri`/`iri` with rfc3987, `uri-template`, `json-pointer`,
`hostname` with fqdn) and passes every string otherwise; its `email` check is `"@" in value`. A format a
backend leaves to validation (or enforces loosely) would then pass unchecked, and the answer would depend
on what happens to be installed. These checks follow the definitions JSON Schema 2020-12 names, ASCII
digits only:

- `date-time`, `time`: RFC 3339 section 5.6 (`T`/`Z` in either case, an offset required, a leap second
  only at 23:59:60 UTC);
- `duration`: the ABNF of RFC 3339 Appendix A (`P1Y2M3DT4H5M6S`, `PT36H`, `P2W`; no week beside other units);
- `uri`, `uri-reference`: RFC 3986 (`URI` needs a scheme; `URI-reference` may be relative); `iri`,
  `iri-reference`: RFC 3987, the same with non-ASCII characters where it allows them;
- `uri-template`: RFC 6570 (level 4 syntax); `json-pointer`: RFC 6901; `relative-json-pointer`:
  draft-bhutton-relative-json-pointer-00;
- `email`: RFC 5321's Mailbox (dot-atom or quoted local part, a domain or an address literal); `idn-email`:
  RFC 6531's, with non-ASCII characters in both parts; `hostname`: RFC 1123 (letters in either case).
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Callable

_DATE = r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
_TIME = r"([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.[0-9]+)?(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))"
_DATE_TIME_RE = re.compile(_DATE + "[Tt]" + _TIME)
_TIME_RE = re.compile(_TIME)


def _full_time(groups: tuple[str | None, ...]) -> bool:
    hour, minute, second = int(groups[0] or 0), int(groups[1] or 0), int(groups[2] or 0)
    sign, off_hour, off_minute = groups[3], int(groups[4] or 0), int(groups[5] or 0)
    if hour > 23 or minute > 59 or second > 60 or off_hour > 23 or off_minute > 59:
        return False
    if second < 60:
        return True
    offset = (off_hour * 60 + off_minute) * (-1 if sign == "-" else 1)
    return (hour * 60 + minute - offset) % (24 * 60) == 23 * 60 + 59  # a leap second ends a UTC day


def is_date_time(instance: object) -> bool:
    """RFC 3339 `date-time`: `2026-01-31T23:59:59.5+01:00`."""
    if not isinstance(instance, str):
        return True
    match = _DATE_TIME_RE.fullmatch(instance)
    if match is None:
        return False
    year, month, day = (int(g) for g in match.groups()[:3])
    return 1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1] and _full_time(match.groups()[3:])


def is_time(instance: object) -> bool:
    """RFC 3339 `full-time`: `23:59:59Z`, `08:30:00.25-05:00` (the offset is required)."""
    if not isinstance(instance, str):
        return True
    match = _TIME_RE.fullmatch(instance)
    return match is not None and _full_time(match.groups())


_SECOND = r"[0-9]+S"
_MINUTE = rf"[0-9]+M(?:{_SECOND})?"
_HOUR = rf"[0-9]+H(?:{_MINUTE})?"
_DUR_TIME = rf"T(?:{_HOUR}|{_MINUTE}|{_SECOND})"
_DAY = r"[0-9]+D"
_MONTH = rf"[0-9]+M(?:{_DAY})?"
_YEAR = rf"[0-9]+Y(?:{_MONTH})?"
DURATION = rf"P(?:(?:{_DAY}|{_MONTH}|{_YEAR})(?:{_DUR_TIME})?|{_DUR_TIME}|[0-9]+W)"

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
"""Dotted-quad, no leading zeros: what `ipaddress.IPv4Address` (JSON Schema's `ipv4` check) takes."""


def _ipv6() -> str:
    """RFC 4291 text forms as `ipaddress.IPv6Address` takes them (no zone): eight groups, or fewer around one
    `::`, the last two groups optionally written as an IPv4 address."""
    hextet = "[0-9A-Fa-f]{1,4}"

    def groups(count: int) -> str:  # `count` groups joined by ":"
        return "" if count == 0 else hextet if count == 1 else f"{hextet}(?::{hextet}){{{count - 1}}}"

    forms = [f"(?:{hextet}:){{7}}{hextet}", f"(?:{hextet}:){{6}}{IPV4}"]
    for left in range(8):
        forms += [f"{groups(left)}::{groups(right)}" for right in range(8 - left)]
        forms += [f"{groups(left)}::{'' if right == 0 else groups(right) + ':'}{IPV4}" for right in range(6 - left)]
    return "(?:" + "|".join(forms) + ")"


IPV6 = _ipv6()

# RFC 3987's ucschar and iprivate (the non-ASCII characters an IRI may hold, the latter in queries only)
_UCSCHAR = (
    "\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef\U00010000-\U0001fffd\U00020000-\U0002fffd\U00030000-\U0003fffd"
    "\U00040000-\U0004fffd\U00050000-\U0005fffd\U00060000-\U0006fffd\U00070000-\U0007fffd\U00080000-\U0008fffd"
    "\U00090000-\U0009fffd\U000a0000-\U000afffd\U000b0000-\U000bfffd\U000c0000-\U000cfffd\U000d0000-\U000dfffd"
    "\U000e1000-\U000efffd"
)
_IPRIVATE = "\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd"
_PCT = "%[0-9A-Fa-f]{2}"
_SUB_DELIMS = "!$&'()*+,;="
_IP_FUTURE = rf"[vV][0-9A-Fa-f]+\.[A-Za-z0-9\-._~{_SUB_DELIMS}:]+"


def _uri_patterns(iri: bool) -> tuple[str, str]:
    """RFC 3986's `URI` and `relative-ref` (RFC 3987's `IRI` and `irelative-ref` with `iri`)."""
    unreserved = r"A-Za-z0-9\-._~" + (_UCSCHAR if iri else "")
    pchar = rf"(?:[{unreserved}{_SUB_DELIMS}:@]|{_PCT})"
    segment, segment_nz = f"{pchar}*", f"{pchar}+"
    segment_nz_nc = rf"(?:[{unreserved}{_SUB_DELIMS}@]|{_PCT})+"
    userinfo = rf"(?:[{unreserved}{_SUB_DELIMS}:]|{_PCT})*"
    host = rf"(?:\[(?:{IPV6}|{_IP_FUTURE})\]|(?:[{unreserved}{_SUB_DELIMS}]|{_PCT})*)"
    authority = rf"(?:{userinfo}@)?{host}(?::[0-9]*)?"
    abempty = f"(?:/{segment})*"
    absolute = f"/(?:{segment_nz}(?:/{segment})*)?"
    query = rf"(?:\?(?:{pchar}|[/?{_IPRIVATE if iri else ''}])*)?"
    fragment = rf"(?:#(?:{pchar}|[/?])*)?"
    scheme = r"[A-Za-z][A-Za-z0-9+\-.]*"
    hier = rf"(?://{authority}{abempty}|{absolute}|{segment_nz}(?:/{segment})*|)"
    relative = rf"(?://{authority}{abempty}|{absolute}|{segment_nz_nc}(?:/{segment})*|)"
    return f"{scheme}:{hier}{query}{fragment}", f"{relative}{query}{fragment}"


URI, _RELATIVE_REF = _uri_patterns(iri=False)
IRI, _IRELATIVE_REF = _uri_patterns(iri=True)
URI_REFERENCE, IRI_REFERENCE = f"(?:{URI}|{_RELATIVE_REF})", f"(?:{IRI}|{_IRELATIVE_REF})"

_LITERAL = rf"(?:[\x21\x23\x24\x26\x28-\x3b\x3d\x3f-\x5b\x5d\x5f\x61-\x7a\x7e{_UCSCHAR}{_IPRIVATE}]|{_PCT})"
_VARNAME = rf"(?:[A-Za-z0-9_]|{_PCT})(?:\.?(?:[A-Za-z0-9_]|{_PCT}))*"
_VARSPEC = rf"{_VARNAME}(?::[1-9][0-9]{{0,3}}|\*)?"
URI_TEMPLATE = rf"(?:{_LITERAL}|\{{[+#./;?&=,!@|]?{_VARSPEC}(?:,{_VARSPEC})*\}})*"

JSON_POINTER = "(?:/(?:[^~/]|~[01])*)*"
RELATIVE_JSON_POINTER = rf"(?:0|[1-9][0-9]*)(?:[+-][1-9][0-9]*)?(?:#|{JSON_POINTER})"

_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME = rf"{_LABEL}(?:\.{_LABEL})*\.?"
"""RFC 1123 host names but for the 253-character bound on the whole name (`is_hostname` checks that too)."""


def _mailbox(international: bool) -> str:
    """RFC 5321 `Mailbox` (RFC 6531's with `international`: UTF-8 in atoms, quoted strings and labels).

    An address literal is an IPv4 address, `IPv6:` and an IPv6 address, or a standardized tag (any other
    label: the tag spelled `IPv6` in any case is excluded letter by letter) and its content."""
    utf8 = "\u0080-\U0010ffff" if international else ""
    atom = rf"[A-Za-z0-9!#$%&'*+\-/=?^_`{{|}}~{utf8}]+"
    quoted = rf'"(?:[\x20\x21\x23-\x5b\x5d-\x7e{utf8}]|\\[\x20-\x7e])*"'
    label = rf"[A-Za-z0-9{utf8}](?:[A-Za-z0-9\-{utf8}]*[A-Za-z0-9{utf8}])?"
    end, inner = "[A-Za-z0-9]", "[A-Za-z0-9-]"
    not_ipv6 = (
        rf"[A-HJ-Za-hj-z0-9]{inner}{{2}}{end}|[Ii][A-OQ-Za-oq-z0-9-]{inner}{end}|[Ii][Pp][A-UW-Za-uw-z0-9-]{end}"
        rf"|[Ii][Pp][Vv][A-Za-z0-57-9]"
    )
    tag = rf"(?:{end}|{end}{{2}}|{end}{inner}{end}|{not_ipv6}|{end}{inner}{{3,}}{end})"
    literal = rf"\[(?:{IPV4}|[Ii][Pp][Vv]6:{IPV6}|{tag}:[\x21-\x5a\x5e-\x7e]+)\]"
    return rf"(?:{atom}(?:\.{atom})*|{quoted})@(?:{label}(?:\.{label})*|{literal})"


EMAIL, IDN_EMAIL = _mailbox(international=False), _mailbox(international=True)

_GRAMMAR_DATE = "[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
_GRAMMAR_TIME = (
    "(?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?:\\.[0-9]+)?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
)

GRAMMAR_PATTERNS: dict[str, str] = {
    "date-time": f"{_GRAMMAR_DATE}[Tt]{_GRAMMAR_TIME}",
    "time": _GRAMMAR_TIME,
    "duration": DURATION,
    "ipv4": IPV4,
    "ipv6": IPV6,
    "uri": URI,
    "uri-reference": URI_REFERENCE,
    "iri": IRI,
    "iri-reference": IRI_REFERENCE,
    "uri-template": URI_TEMPLATE,
    "json-pointer": JSON_POINTER,
    "relative-json-pointer": RELATIVE_JSON_POINTER,
    "hostname": HOSTNAME,
    "email": EMAIL,
    "idn-email": IDN_EMAIL,
}
"""Each format as one full-match regex in the syntax ECMA-262 and Python share (no lookaround, no `\\d`/`\\w`,
no `.`): a backend given this pattern enforces the check below exactly, but for a host name's length and the
calendar of a date (the day of a month, where a leap second may stand): those are validated."""
WIDER_THAN_CHECK = {"hostname", "date-time", "time"}


def _full_match(pattern: str) -> Callable[[object], bool]:
    compiled = re.compile(pattern, re.DOTALL)

    def check(instance: object) -> bool:
        return not isinstance(instance, str) or compiled.fullmatch(instance) is not None

    return check


is_duration = _full_match(DURATION)
is_uri = _full_match(URI)
is_uri_reference = _full_match(URI_REFERENCE)
is_iri = _full_match(IRI)
is_iri_reference = _full_match(IRI_REFERENCE)
is_uri_template = _full_match(URI_TEMPLATE)
is_json_pointer = _full_match(JSON_POINTER)
is_relative_json_pointer = _full_match(RELATIVE_JSON_POINTER)
is_email = _full_match(EMAIL)
is_idn_email = _full_match(IDN_EMAIL)
_is_hostname_text = _full_match(HOSTNAME)


def is_hostname(instance: object) -> bool:
    """RFC 1123 host names, letters in either case: labels of 1-63 letters, digits and inner hyphens, 253
    characters at most (a final dot aside)."""
    if not isinstance(instance, str):
        return True
    return _is_hostname_text(instance) and len(instance.removesuffix(".")) <= 253


def is_regex(instance: object) -> bool:
    """An ECMA-262 regular expression, as JSON Schema's `regex` format and `pattern` keyword read it."""
    from parley.constrained.errors import InvalidRegexError
    from parley.constrained.pattern_match import check_pattern

    if not isinstance(instance, str):
        return True
    try:
        check_pattern(instance)
    except InvalidRegexError:
        return False
    return True


CHECKS: dict[str, Callable[[object], bool]] = {
    "regex": is_regex,
    "date-time": is_date_time,
    "time": is_time,
    "duration": is_duration,
    "uri": is_uri,
    "uri-reference": is_uri_reference,
    "iri": is_iri,
    "iri-reference": is_iri_reference,
    "uri-template": is_uri_template,
    "json-pointer": is_json_pointer,
    "relative-json-pointer": is_relative_json_pointer,
    "hostname": is_hostname,
    "email": is_email,
    "idn-email": is_idn_email,
}
"""Checked by parley, in place of `jsonschema`'s own check or its missing one."""
