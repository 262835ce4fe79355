"""parley's own `format` checks (`parley.constrained.formats`), and the validator using them whatever is installed."""

from __future__ import annotations

import json

import pytest

from parley.constrained import ValidationFailed, validate
from parley.constrained.formats import CHECKS

VALID = {
    "date-time": ["1963-06-19T08:30:06.283185Z", "1963-06-19t08:30:06z", "2020-02-29T00:00:00+05:30",
                  "1998-12-31T23:59:60Z", "1998-12-31T15:59:60.123-08:00", "6920-01-10T11:32:07.000194+22:41"],
    "time": ["08:30:06Z", "23:59:60Z", "15:59:60-08:00", "08:30:06.5+01:00", "00:00:00z"],
    "duration": ["P4DT12H30M5S", "P1Y2M3DT4H5M6S", "PT36H", "P1DT12H", "P2W", "P1M", "PT1M", "PT0S", "P0D", "P4Y"],
    "uri": ["http://foo.bar/?baz=qux#quux", "https://example.com/x", "urn:isbn:0451450523", "mailto:a@b.c",
            "http://[2001:db8::7]/c=GB?objectClass?one", "tel:+1-816-555-1212", "ldap://[v1.fe]/", "a:",
            "http://example.com/%7Efoo", "file:///etc/hosts", "a://[V1.x]/", "u://[::5bC:fD:2eaB:216.6.252.156]:04//"],
    "uri-reference": ["http://foo.bar/x", "/abc", "../a/b", "#fragment", "", "?q=1", "a/b:c"],
    "iri": ["http://ƒøø.ßår/?∂éœ=πîx#πîüx", "http://example.com/x", "urn:a:é"],
    "iri-reference": ["//ƒøø.ßår/?∂éœ=πîx#πîüx", "#ƒrägmênt", "/âππ"],
    "uri-template": ["http://example.com/dictionary/{term:1}/{term}", "http://x/{?q,page}", "{+path}/here",
                     "/{var*}", "plain", "{a.b,c_d}", "%20{x}"],
    "json-pointer": ["", "/", "/foo/0", "/a~1b", "/m~0n", "/ ", "/c%d", "/é"],
    "relative-json-pointer": ["0", "1", "0/foo/bar", "2/0/baz/1/zip", "0#", "120/foo/bar", "0+1/a"],
    "hostname": ["example.com", "fr.y.q.G5.sport", "a", "xn--4gbwdl.xn--wgbh1c", "example.com."],
    "email": ["joe.bloggs@example.com", '"joe bloggs"@example.com', '"joe..bloggs"@example.com',
              "joe.bloggs@[127.0.0.1]", "joe.bloggs@[IPv6:::1]", "te~st@example.com", "BW@m.a.nikE", "a@b.c",
              "a@[IPv6:1:2:3:4:5:6:1.2.3.4]", "a@[ipv6:::1]", "a@[tag:x]", "a@[IPV6x:1]", "a@[i-v6:x]", "a@[ipv7:%]"],
    "idn-email": ["실례@실례.테스트", "joe.bloggs@example.com"],
}  # fmt: skip
INVALID = {
    "date-time": ["1990-02-31T15:59:59.123-08:00", "1990-12-31T15:59:59-24:00", "1998-12-31T22:59:60Z",
                  "1963-06-19T08:30:06.28123+01:00Z", "06/19/1963 08:30:06 PST", "2013-350T01:01:01",
                  "1963-6-19T08:30:06.283185Z", "1963-06-19T08:30:06", "1963-06-1৪T00:00:00Z", "2021-02-29T00:00:00Z",
                  "2020-01-01T24:00:00Z", "2020-01-01 00:00:00Z", "x"],
    "time": ["08:30:06", "22:59:60Z", "23:59:60+01:00", "24:00:00Z", "08:30:06 PST", "01:01:01,1111Z", "1২:00:00Z",
             "08:30:06+00:60", "8:30:06Z", "08:30:06.Z"],
    "duration": ["PT1D", "4DT12H30M5S", "P", "P1YT", "PT", "P2D1Y", "P1D2H", "P2S", "P1Y2W", "P২Y", "P1",
                 "-P0Y0", "P3Y1424501960M82346517528", "P1.5Y", "p1y"],
    "uri": ["//foo.bar/?baz=qux#quux", "/abc", "\\\\WINDOWS\\fileshare", "abc", "http:// shouldfail.com",
            ":// should fail", "bar,baz:foo", "http://example.com/a b", "http://[::1%25eth0]/", "http://[1::2::3]/",
            "http://ƒøø.ßår/", "http://example.com/%zz"],
    "uri-reference": ["\\\\WINDOWS\\fileshare", "#frag\\ment", "a b", "%"],
    "iri": ["/abc", "http://a b", "http://[1::2::3]/"],
    "iri-reference": ["\\\\WINDOWS\\filëshare", "#ƒräg\\mênt"],
    "uri-template": ["http://example.com/dictionary/{term:1}/{term", "{}", "{a:0}", "{a b}", "a b", "{a:10000}",
                     "}", "%zz"],
    "json-pointer": ["#", "#/", "a", "/foo/bar~", "/~2", "/~-1", "/~~", "foo/bar"],
    "relative-json-pointer": ["/foo/bar", "-1/foo/bar", "+1/foo/bar", "0##", "01/a", "01#", "", "1/~2"],
    "hostname": ["-a.com", "a-.com", "a..b", "", "a_b.com", "a" * 64 + ".com", "exa mple.com"],
    "email": ["2962", ".test@example.com", "test.@example.com", "te..st@example.com", "joe.bloggs@invalid=domain.com",
              "joe.bloggs@[127.0.0.300]", "a b@c.d", "a@", "@b.c", "a@-b.c", "실례@실례.테스트", "a@[ipv6:zz]",
              "a@[IpV6:1]", "a@[1.2.3.04]", "a@[-a:x]", "a@[tag:]", "a@[IPv6:::1%eth0]"],
    "idn-email": ["2962", "a@", ".a@b.c"],
}  # fmt: skip


@pytest.mark.parametrize(("fmt", "value"), [(fmt, v) for fmt, values in VALID.items() for v in values])
def test_parley_accepts_valid_values_of_each_format(fmt: str, value: str) -> None:
    assert CHECKS[fmt](value)
    validate(_quoted(value), {"type": "string", "format": fmt})


@pytest.mark.parametrize(("fmt", "value"), [(fmt, v) for fmt, values in INVALID.items() for v in values])
def test_parley_rejects_invalid_values_of_each_format(fmt: str, value: str) -> None:
    assert not CHECKS[fmt](value)
    with pytest.raises(ValidationFailed) as failed:
        validate(_quoted(value), {"type": "string", "format": fmt})
    assert failed.value.keyword == "format"


def _quoted(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def test_every_2020_12_format_is_checked_without_optional_packages() -> None:
    """No add-on installed here checks these: without parley's checks every string passed (hostname before
    Github_hard o27023, date-time, duration, uri... before Github_trivial o41609's review)."""
    from parley.constrained.validate import _format_checker

    formats = {"date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4",
               "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer",
               "relative-json-pointer", "regex"}  # fmt: skip
    assert formats <= set(_format_checker().checkers)
    for fmt in sorted(formats):
        with pytest.raises(ValidationFailed):
            validate(_quoted("\\ not a value of any format ["), {"format": fmt})


def test_non_strings_pass_every_format() -> None:
    for check in CHECKS.values():
        assert check(5) and check(None) and check({"a": 1})
