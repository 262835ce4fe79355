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
import ipaddress
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
_DURATION_RE = re.compile(rf"P(?:(?:{_DAY}|{_MONTH}|{_YEAR})(?:{_DUR_TIME})?|{_DUR_TIME}|[0-9]+W)")


def is_duration(instance: object) -> bool:
    """RFC 3339 Appendix A `duration`: `P1Y2M3DT4H5M6S`, `PT36H`, `P2W` (units in order, none empty)."""
    return not isinstance(instance, str) or _DURATION_RE.fullmatch(instance) is not None


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


def _uri_regexes(iri: bool) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """RFC 3986's `URI` and `relative-ref` (RFC 3987's `IRI` and `irelative-ref` with `iri`); an IP literal is
    captured as `literal` and checked apart."""
    unreserved = r"A-Za-z0-9\-._~" + (_UCSCHAR if iri else "")
    pchar = rf"(?:[{unreserved}{_SUB_DELIMS}:@]|{_PCT})"
    segment, segment_nz = f"{pchar}*", f"{pchar}+"
    segment_nz_nc = rf"(?:[{unreserved}{_SUB_DELIMS}@]|{_PCT})+"
    userinfo = rf"(?:[{unreserved}{_SUB_DELIMS}:]|{_PCT})*"
    host = rf"(?:\[(?P<literal>[^\]]*)\]|(?:[{unreserved}{_SUB_DELIMS}]|{_PCT})*)"
    authority = rf"(?:{userinfo}@)?{host}(?::[0-9]*)?"
    abempty = f"(?:/{segment})*"
    absolute = f"/(?:{segment_nz}(?:/{segment})*)?"
    query = rf"(?:\?(?:{pchar}|[/?{_IPRIVATE if iri else ''}])*)?"
    fragment = rf"(?:#(?:{pchar}|[/?])*)?"
    scheme = r"[A-Za-z][A-Za-z0-9+\-.]*"
    hier = rf"(?://{authority}{abempty}|{absolute}|{segment_nz}(?:/{segment})*|)"
    relative = rf"(?://{authority}{abempty}|{absolute}|{segment_nz_nc}(?:/{segment})*|)"
    return re.compile(f"{scheme}:{hier}{query}{fragment}"), re.compile(f"{relative}{query}{fragment}")


_URI, _RELATIVE_REF = _uri_regexes(iri=False)
_IRI, _IRELATIVE_REF = _uri_regexes(iri=True)
_IP_FUTURE = re.compile(rf"[vV][0-9A-Fa-f]+\.[A-Za-z0-9\-._~{_SUB_DELIMS}:]+")


def _ip_literal_ok(match: re.Match[str]) -> bool:
    literal = match.group("literal")
    if literal is None or _IP_FUTURE.fullmatch(literal):
        return True
    try:
        ipaddress.IPv6Address(literal)
    except ValueError:
        return False
    return "%" not in literal  # RFC 3986 has no zone identifiers


def _matches(regexes: tuple[re.Pattern[str], ...], instance: object) -> bool:
    if not isinstance(instance, str):
        return True
    for regex in regexes:
        match = regex.fullmatch(instance)
        if match is not None:
            return _ip_literal_ok(match)
    return False


def is_uri(instance: object) -> bool:
    """RFC 3986 `URI`: a scheme, then `:` (`https://example.com/a?b#c`, `urn:isbn:0451450523`)."""
    return _matches((_URI,), instance)


def is_uri_reference(instance: object) -> bool:
    """RFC 3986 `URI-reference`: a URI or a relative reference (`../a`, `#frag`, ``)."""
    return _matches((_URI, _RELATIVE_REF), instance)


def is_iri(instance: object) -> bool:
    """RFC 3987 `IRI`: a URI that may hold non-ASCII characters (`http://ƒøø.ßår/?∂éœ=πîx#πîüx`)."""
    return _matches((_IRI,), instance)


def is_iri_reference(instance: object) -> bool:
    """RFC 3987 `IRI-reference`."""
    return _matches((_IRI, _IRELATIVE_REF), instance)


_LITERAL = rf"(?:[\x21\x23\x24\x26\x28-\x3b\x3d\x3f-\x5b\x5d\x5f\x61-\x7a\x7e{_UCSCHAR}{_IPRIVATE}]|{_PCT})"
_VARNAME = rf"(?:[A-Za-z0-9_]|{_PCT})(?:\.?(?:[A-Za-z0-9_]|{_PCT}))*"
_VARSPEC = rf"{_VARNAME}(?::[1-9][0-9]{{0,3}}|\*)?"
_URI_TEMPLATE = re.compile(rf"(?:{_LITERAL}|\{{[+#./;?&=,!@|]?{_VARSPEC}(?:,{_VARSPEC})*\}})*")


def is_uri_template(instance: object) -> bool:
    """RFC 6570 URI Template: literals and `{...}` expressions (`http://x/{id}{?q,page}`)."""
    return not isinstance(instance, str) or _URI_TEMPLATE.fullmatch(instance) is not None


_JSON_POINTER = "(?:/(?:[^~/]|~[01])*)*"
_JSON_POINTER_RE = re.compile(_JSON_POINTER, re.DOTALL)
_RELATIVE_JSON_POINTER_RE = re.compile(rf"(?:0|[1-9][0-9]*)(?:[+-][1-9][0-9]*)?(?:#|{_JSON_POINTER})", re.DOTALL)


def is_json_pointer(instance: object) -> bool:
    """RFC 6901 JSON Pointer: empty, or `/`-prefixed tokens with `~` only as `~0` or `~1`."""
    return not isinstance(instance, str) or _JSON_POINTER_RE.fullmatch(instance) is not None


def is_relative_json_pointer(instance: object) -> bool:
    """Relative JSON Pointer: a non-negative integer (no leading zero), an optional index shift, then `#` or
    a JSON Pointer (`0/foo`, `1#`, `0+1/a`)."""
    return not isinstance(instance, str) or _RELATIVE_JSON_POINTER_RE.fullmatch(instance) is not None


_HOSTNAME_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def is_hostname(instance: object) -> bool:
    """RFC 1123 host names, letters in either case: labels of 1-63 letters, digits and inner hyphens, 253
    characters at most."""
    if not isinstance(instance, str):
        return True
    name = instance[:-1] if instance.endswith(".") else instance
    return 0 < len(name) <= 253 and all(_HOSTNAME_LABEL.fullmatch(label) for label in name.split("."))


def _mailbox(international: bool) -> re.Pattern[str]:
    """RFC 5321 `Mailbox` (RFC 6531's with `international`: UTF-8 in atoms, quoted strings and labels)."""
    utf8 = "\u0080-\U0010ffff" if international else ""
    atom = rf"[A-Za-z0-9!#$%&'*+\-/=?^_`{{|}}~{utf8}]+"
    quoted = rf'"(?:[\x20\x21\x23-\x5b\x5d-\x7e{utf8}]|\\[\x20-\x7e])*"'
    label = rf"[A-Za-z0-9{utf8}](?:[A-Za-z0-9\-{utf8}]*[A-Za-z0-9{utf8}])?"
    literal = r"\[(?P<literal>[^\[\]\\]+)\]"
    return re.compile(rf"(?:{atom}(?:\.{atom})*|{quoted})@(?:{label}(?:\.{label})*|{literal})")


_EMAIL, _IDN_EMAIL = _mailbox(international=False), _mailbox(international=True)
_GENERAL_LITERAL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?:[\x21-\x5a\x5e-\x7e]+")


def _address_literal(literal: str) -> bool:
    """RFC 5321 address literals: `127.0.0.1`, `IPv6:::1`, or a standardized tag and its content."""
    try:
        if literal[:5].lower() == "ipv6:":
            ipaddress.IPv6Address(literal[5:])
        else:
            ipaddress.IPv4Address(literal)
        return "%" not in literal
    except ValueError:
        return literal[:5].lower() != "ipv6:" and ":" in literal and bool(_GENERAL_LITERAL.fullmatch(literal))


def _is_mailbox(regex: re.Pattern[str], instance: object) -> bool:
    if not isinstance(instance, str):
        return True
    match = regex.fullmatch(instance)
    return match is not None and (match.group("literal") is None or _address_literal(match.group("literal")))


def is_email(instance: object) -> bool:
    """RFC 5321 `Mailbox`: `joe.bloggs@example.com`, `"joe bloggs"@example.com`, `a@[127.0.0.1]`."""
    return _is_mailbox(_EMAIL, instance)


def is_idn_email(instance: object) -> bool:
    """RFC 6531 `Mailbox`: `email` with non-ASCII characters (`실례@실례.테스트`)."""
    return _is_mailbox(_IDN_EMAIL, instance)


CHECKS: dict[str, Callable[[object], bool]] = {
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
