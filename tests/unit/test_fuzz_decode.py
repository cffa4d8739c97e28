"""Property-based fuzzing of everything that decodes caller input (docs/security.md).

No root, no I/O: the CNI environment (`cni.env.parse_env`, `parse_cni_args`), stdin
(`cni.netconf.decode_json`, `parse_netconf`), a chained `prevResult`
(`cni.result.Result.from_dict`) and the frame around them (`cni.skel.run`). For any
input, each call either succeeds with a value that meets the trust model's constraints, or
raises `CniError` with a documented decode code — never another exception, and the frame
never answers a decode problem with code 100.

Deterministic companions pin the bounds: 100,000-deep arrays and objects (also UTF-16/32
encoded, with characters whose bytes look like '[' and '"') and 65 levels give code 6, not
RecursionError; stdin of 1 MiB is read, one byte more is code 6.

Strategies (`HOSTILE`, `env_text`, `numbers`, `prev_results`) and the independent checkers
(`prev_result_problems`, `mac_ok`) are shared with tests/integration/test_fuzz_plugin.py.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import unicodedata
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cni import skel
from cni import version as cniversion
from cni.env import VERBS, parse_cni_args, parse_env
from cni.errors import CniError
from cni.netconf import decode_json, parse_netconf
from cni.result import Result

DECODE_CODES = {1, 2, 4, 6, 7}  # what decoding env + stdin may answer (docs/errors.md)
ENV_CODE = 4
PREV_RESULT_CODE = 6
MAX_STDIN = 1 << 20
MAX_NESTING = 64
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")  # CNI_CONTAINERID, network name (whole string)
_MAC_RE = re.compile(r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}")
_TRUE = {"1", "true", "True", "TRUE"}
_KNOWN_ARGS = {"IgnoreUnknown", "K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_UID",
               "K8S_POD_INFRA_CONTAINER_ID", "MAC", "IP"}

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---- strategies -------------------------------------------------------------------------

HOSTILE = [
    "", " ", "\0", "a\0b", "\n", "abc\n", "\nabc", "\r\n", "\t", "\x7f", "\x80", "\x85", "\u00a0",
    "\u2028", "\u202e", "\ufeff", "é", "İ", "ß", "ﬃ", "😀", "\ud800", "\udcff", ".", "..", "../..",
    "a/../b", "/", "//", "/..", "/./", "/etc/passwd", "../../etc", "-", "-1", "0", "1e309", "NaN",
    "Infinity", "true", "null", "{}", "[]", "${HOME}", "$(id)", "%s%n", "\\", "'", '"', ";", "=", ":",
    "a" * 16, "a" * 201, "ab" * 600,
]
hostile_text = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(max_size=20),
    st.builds(lambda a, b: a + b, st.sampled_from(HOSTILE), st.text(max_size=8)),
    st.builds(lambda a, b: a + b, st.text(max_size=8), st.sampled_from(HOSTILE)),
)
# Text that can be an environment variable: no NUL, no lone surrogate outside
# surrogateescape's range (os.environ cannot hold either).
env_text = hostile_text.map(
    lambda s: "".join(c for c in s if c != "\0" and not ("\ud800" <= c <= "\udc7f"
                                                           or "\udd00" <= c <= "\udfff")))
numbers = st.one_of(
    st.integers(-(2**64), 2**64),
    st.sampled_from([0, -1, 1, 68, 1500, 4094, 4095, 65535, 65536, 2**31, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1.5, -0.0, 1e308, float("inf"), float("-inf"), float("nan")]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, hostile_text)
json_keys = st.one_of(
    st.sampled_from(["cniVersion", "name", "type", "ipam", "runtimeConfig", "args", "cni", "ips",
                     "prevResult", "interfaces", "routes", "dns", "mac", "address", "", "\0", "Mac"]),
    hostile_text,
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(json_keys, children, max_size=4)),
    max_leaves=20,
)
# Anything that is not of the named type's shape (for replacing a typed field).
weird = st.one_of(st.none(), st.booleans(), numbers, hostile_text, st.lists(scalars, max_size=2),
                  st.dictionaries(json_keys, scalars, max_size=2))

addresses = st.sampled_from(["10.77.0.5/24", "10.77.0.5", "fd00::5/64", "fd00::5", "0.0.0.0/0",
                             "10.0.0.1/33", "10.0.0.999/24", "::/0", "10.77.0.5/24 ", "", "x"])
gateways = st.sampled_from(["10.77.0.1", "fd00::1", "10.77.0.1/24", "", "x", "256.0.0.1"])
networks = st.sampled_from(["0.0.0.0/0", "10.0.0.0/8", "10.0.0.1/8", "::/0", "fd00::/64", "x", "10/8"])


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value: usually (3 in 4) of its own shape, else anything. (Not `one_of`:
    it would flatten `weird`'s branches in and make the right shape rare.)"""
    return st.integers(0, 3).flatmap(lambda i: weird if i == 0 else strategy)


interfaces_st = st.fixed_dictionaries(
    {"name": maybe(st.sampled_from(["net1", "eth0", "tn0123456789a", ""]))},
    optional={
        "mac": maybe(st.sampled_from(["02:00:00:00:00:01", "", "zz"])),
        "mtu": maybe(st.integers(-1, 70000)),
        "sandbox": maybe(st.sampled_from(["/run/netns/x", ""])),
        "socketPath": maybe(st.just("/run/x.sock")),
        "pciID": maybe(st.just("0000:3b:00.2")),
    },
)
ips_st = st.fixed_dictionaries(
    {"address": maybe(addresses)},
    optional={"gateway": maybe(gateways), "interface": maybe(st.integers(-2, 4)),
              "version": maybe(st.sampled_from(["4", "6"]))},
)
routes_st = st.fixed_dictionaries(
    {"dst": maybe(networks)},
    optional={"gw": maybe(gateways), "mtu": maybe(st.integers(0, 9000)),
              "advmss": maybe(st.integers(0, 9000)), "priority": maybe(st.integers(0, 100)),
              "table": maybe(st.integers(0, 300)), "scope": maybe(st.integers(0, 255))},
)
dns_st = st.fixed_dictionaries(
    {},
    optional={"nameservers": maybe(st.lists(maybe(st.just("10.0.0.53")), max_size=2)),
              "domain": maybe(st.just("example.org")),
              "search": maybe(st.lists(maybe(st.just("example.org")), max_size=2)),
              "options": maybe(st.lists(maybe(st.just("ndots:5")), max_size=2))},
)
prev_results = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={"cniVersion": maybe(st.sampled_from(cniversion.SUPPORTED)),
                  "interfaces": maybe(st.lists(maybe(interfaces_st), max_size=3)),
                  "ips": maybe(st.lists(maybe(ips_st), max_size=3)),
                  "routes": maybe(st.lists(maybe(routes_st), max_size=3)),
                  "dns": maybe(dns_st)},
    ),
    json_values,
)

# ---- the trust model's constraints, written independently of the code -----------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def prev_result_problems(raw: Any) -> list[str]:
    """Why `raw` is not a well-typed CNI result ("every field type-checked (strings, integers,
    addresses)"); [] if it is. A null field counts as absent."""
    if not isinstance(raw, dict):
        return ["prevResult is not an object"]
    problems: list[str] = []

    def typed(where: str, value: Any, kind: str) -> None:
        if value is None:
            return
        ok = {"str": isinstance(value, str), "int": _is_int(value)}[kind]
        if not ok:
            problems.append(f"{where}={value!r} is not a {kind}")

    def address(where: str, value: Any, parse: Any, required: bool = False) -> None:
        if value is None:
            if required:
                problems.append(f"{where} is missing")
            return
        if not isinstance(value, str):
            problems.append(f"{where}={value!r} is not a string")
            return
        if value == "" and not required:
            return
        try:
            parse(value)
        except ValueError:
            problems.append(f"{where}={value!r} is not an address")

    def items(key: str) -> list[Any]:
        value = raw.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            problems.append(f"{key}={value!r} is not a list")
            return []
        good = []
        for i, item in enumerate(value):
            if isinstance(item, dict):
                good.append((i, item))
            else:
                problems.append(f"{key}[{i}]={item!r} is not an object")
        return good

    typed("cniVersion", raw.get("cniVersion"), "str")
    for i, itf in items("interfaces"):
        if not isinstance(itf.get("name"), str):
            problems.append(f"interfaces[{i}].name={itf.get('name')!r} is not a string")
        for key in ("mac", "sandbox", "socketPath", "pciID"):
            typed(f"interfaces[{i}].{key}", itf.get(key), "str")
        typed(f"interfaces[{i}].mtu", itf.get("mtu"), "int")
    for i, ip in items("ips"):
        address(f"ips[{i}].address", ip.get("address"), ipaddress.ip_interface, required=True)
        address(f"ips[{i}].gateway", ip.get("gateway"), ipaddress.ip_address)
        typed(f"ips[{i}].interface", ip.get("interface"), "int")
        if _is_int(ip.get("interface")) and ip["interface"] < 0:
            problems.append(f"ips[{i}].interface is negative")
        typed(f"ips[{i}].version", ip.get("version"), "str")
    for i, route in items("routes"):
        address(f"routes[{i}].dst", route.get("dst"),
                lambda v: ipaddress.ip_network(v, strict=False), required=True)
        address(f"routes[{i}].gw", route.get("gw"), ipaddress.ip_address)
        for key in ("mtu", "advmss", "priority", "table", "scope"):
            typed(f"routes[{i}].{key}", route.get(key), "int")
    dns = raw.get("dns")
    if dns is not None and not isinstance(dns, dict):
        problems.append(f"dns={dns!r} is not an object")
    elif isinstance(dns, dict):
        typed("dns.domain", dns.get("domain"), "str")
        for key in ("nameservers", "search", "options"):
            value = dns.get(key)
            if value is not None and (not isinstance(value, list)
                                      or not all(isinstance(v, str) for v in value)):
                problems.append(f"dns.{key}={value!r} is not a list of strings")
    return problems


def ifname_problem(value: str) -> str | None:
    """CNI_IFNAME: 1–15 bytes, no '/', ':', whitespace, control characters, not '.'/'..'."""
    try:
        size = len(value.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        return "not encodable as bytes"
    if not 1 <= size <= 15:
        return f"{size} bytes"
    if value in (".", ".."):
        return "dot name"
    for ch in value:
        if ch in "/:" or ch.isspace() or unicodedata.category(ch) == "Cc":
            return f"contains {ch!r}"
    return None


def name_problem(value: Any) -> str | None:
    if not isinstance(value, str):
        return "not a string"
    if len(value) > 200 or not _NAME_RE.fullmatch(value):
        return "does not match the whole pattern"
    return None


def mac_ok(value: str) -> bool:
    return bool(_MAC_RE.fullmatch(value)) and not int(value[:2], 16) & 1 and \
        value.replace(":", "") != "0" * 12


def depth_of(value: Any) -> int:
    """Nesting levels of objects and arrays (a scalar is 0, `[]` is 1)."""
    level, todo = 0, [(value, 1)]
    while todo:
        item, d = todo.pop()
        if isinstance(item, dict | list):
            level = max(level, d)
            todo.extend((v, d + 1) for v in (item.values() if isinstance(item, dict) else item))
    return level


def check_cni_args(text: str, args: Any) -> None:
    """A CNI_ARGS string that parsed: what the parser let through is what the spec allows."""
    pairs: dict[str, str] = {}
    for item in text.split(";"):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        assert sep and key.strip(), f"malformed item {item!r} accepted"
        pairs[key.strip()] = value
    if pairs.get("IgnoreUnknown") not in _TRUE:
        assert set(pairs) <= _KNOWN_ARGS, f"unknown keys accepted without IgnoreUnknown: {pairs}"
    assert args.mac == "" or mac_ok(args.mac), f"MAC={args.mac!r} accepted"
    for ip in args.ips:
        ipaddress.ip_interface(ip)


def assert_decode_error(err: CniError, codes: set[int] = DECODE_CODES) -> None:
    assert isinstance(err.code, int) and err.code in codes, f"code {err.code}: {err.msg}"
    assert isinstance(err.msg, str) and err.msg


# ---- CNI environment --------------------------------------------------------------------

BASE_ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "abc123", "CNI_NETNS": "/run/netns/x",
            "CNI_IFNAME": "net1", "CNI_PATH": "/opt/cni/bin:/usr/lib/cni",
            "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod1"}
ENV_VARS = ["CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH", "CNI_ARGS"]

cni_args_items = st.one_of(
    st.builds(lambda k, v: f"{k}={v}",
              st.sampled_from(sorted(_KNOWN_ARGS) + [" K8S_POD_NAME ", "FOO", "ignoreunknown", ""]),
              st.one_of(st.sampled_from(["1", "true", "0", "02:00:00:00:00:01", "01:00:5e:00:00:01",
                                         "00:00:00:00:00:00", "02:00:00:00:00:0G",
                                         "02:00:00:00:00:01\n", "10.0.0.5/24,fd00::5",
                                         "10.0.0.999", "10.0.0.5/24,,", " 10.0.0.5 "]),
                        env_text)),
    env_text,
)
cni_args_text = st.lists(cni_args_items, max_size=6).map(";".join)

env_value = {
    "CNI_COMMAND": st.one_of(st.sampled_from(VERBS + ("add", "ADD\n", " ADD", "")), env_text),
    "CNI_CONTAINERID": st.one_of(st.sampled_from(["abc123", "a" * 200, "a" * 201, "abc\n", "-abc",
                                                  "abc/def", "..", "a.b_c-d", "é"]), env_text),
    "CNI_NETNS": st.one_of(st.sampled_from(["/run/netns/x", "/proc/1/ns/net", "/run/netns/../x",
                                            "/run/netns/x/..", "run/netns/x", "dummy", "/", "",
                                            "/run//netns/x", "/run/netns/./x"]), env_text),
    "CNI_IFNAME": st.one_of(st.sampled_from(["net1", "eth0", "a" * 15, "a" * 16, "é" * 8, "é" * 7,
                                             "net 1", "net\t1", "net\x801", "net1\n", "a:b", ".",
                                             "..", "n/1", "\u00a0", "\u2028"]), env_text),
    "CNI_PATH": env_text,
    "CNI_ARGS": cni_args_text,
}


@st.composite
def environs(draw: st.DrawFn) -> dict[str, str]:
    env = dict(BASE_ENV)
    for var in draw(st.lists(st.sampled_from(ENV_VARS), unique=True, max_size=4)):
        if draw(st.booleans()):
            env[var] = draw(env_value[var])
        else:
            del env[var]
    env.update(draw(st.dictionaries(env_text, env_text, max_size=2)))
    return env


@FUZZ
@given(environs())
@example({**BASE_ENV, "CNI_IFNAME": "net\x801"})  # U+0080 is a (C1) control character
@example({**BASE_ENV, "CNI_IFNAME": "é" * 8})  # 8 characters, 16 bytes
@example({**BASE_ENV, "CNI_CONTAINERID": "abc\n"})
def test_parse_env(environ):
    try:
        env = parse_env(environ)
    except CniError as err:
        assert_decode_error(err, {ENV_CODE})
        return
    assert env.command in VERBS
    if env.command in ("VERSION", "STATUS", "GC"):
        return
    assert name_problem(env.container_id) is None, f"CNI_CONTAINERID={env.container_id!r} accepted"
    problem = ifname_problem(env.ifname)
    assert problem is None, f"CNI_IFNAME={env.ifname!r} accepted ({problem})"
    if env.command in ("ADD", "CHECK") or env.netns:
        assert env.netns.startswith("/") and "\0" not in env.netns, f"CNI_NETNS={env.netns!r}"
        assert ".." not in env.netns.split("/"), f"CNI_NETNS={env.netns!r} accepted"
    check_cni_args(environ.get("CNI_ARGS", ""), env.args)


@FUZZ
@given(st.one_of(cni_args_text, env_text))
def test_parse_cni_args(text):
    try:
        args = parse_cni_args(text)
    except CniError as err:
        assert_decode_error(err, {ENV_CODE})
        return
    check_cni_args(text, args)


# ---- stdin ------------------------------------------------------------------------------


@FUZZ
@given(st.one_of(st.binary(max_size=200),
                 json_values.map(lambda v: json.dumps(v).encode()),
                 st.builds(lambda v, cut: json.dumps(v).encode()[:cut], json_values, st.integers(0, 50)),
                 st.builds(lambda v, enc: json.dumps(v, ensure_ascii=False).encode(enc, "surrogatepass"),
                           json_values, st.sampled_from(["utf-8", "utf-16", "utf-32"]))))
def test_decode_json(data):
    try:
        obj = decode_json(data)
    except CniError as err:
        assert_decode_error(err, {6})
        return
    assert isinstance(obj, dict)
    assert depth_of(obj) <= MAX_NESTING


def _nested(kind: str, depth: int) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


# json.loads(bytes) also takes UTF-16 and UTF-32. There '≛' (U+225B) is the bytes 5B 22 or
# 22 5B: a '[' and a '"' that are no JSON syntax — a byte-level bracket counter must not be
# fooled by them.
ENCODINGS = ["utf-8", "utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"]
DECOYS = ["", '"\u225b", ', '"\u2222", ', '"\u5b22", ']


@pytest.mark.parametrize("decoy", DECOYS)
@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("kind", ["list", "object"])
@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 100_000])
def test_decode_json_deep_nesting(kind, encoding, decoy, depth):
    nested = _nested(kind, depth).decode()
    for text in (nested, '{"x": [' + decoy + nested + ', "\u2222"]}'):
        with pytest.raises(CniError) as err:
            decode_json(text.encode(encoding))
        assert err.value.code == 6


@pytest.mark.parametrize("depth,refused", [(1, False), (MAX_NESTING, False), (MAX_NESTING + 1, True),
                                           (200, True)])
def test_decode_json_nesting_bound(depth, refused):
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "tenantnet"}
    inner: Any = 1
    for _ in range(depth - 1):
        inner = [inner]
    if depth > 1:
        conf["x"] = inner
    data = json.dumps(conf).encode()
    assert depth_of(json.loads(data)) == depth
    if refused:
        with pytest.raises(CniError) as err:
            decode_json(data)
        assert err.value.code == 6
    else:
        assert decode_json(data) == conf


BASE_CONF = {"cniVersion": "1.0.0", "name": "testnet", "type": "tenantnet", "bridge": "br-lab",
             "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.77.0.0/24"}]]}}
CONF_FIELDS = {
    "cniVersion": st.one_of(st.sampled_from(list(cniversion.SUPPORTED) + ["0.2.0", "1.0", "1.0.0\n", ""]),
                            weird),
    "name": st.one_of(st.sampled_from(["testnet", "a" * 200, "a" * 201, "net\n", "../x", "-n", "é"]),
                      weird),
    "type": weird,
    "runtimeConfig": st.one_of(
        st.dictionaries(st.sampled_from(["mac", "ips", "deviceID", "CNIDeviceInfoFile", "dns", "Mac",
                                         "IPs", "DNS"]), json_values, max_size=3),
        json_values),
    "args": st.one_of(st.fixed_dictionaries({"cni": st.one_of(
        st.fixed_dictionaries({"ips": st.one_of(st.lists(maybe(addresses), max_size=3), weird)}),
        json_values)}), json_values),
    "ipam": st.one_of(st.dictionaries(st.sampled_from(["type", "dataDir", "resolvConf", "ranges"]),
                                      json_values, max_size=3), json_values),
    "prevResult": prev_results,
}


@st.composite
def netconfs(draw: st.DrawFn) -> dict[str, Any]:
    conf: dict[str, Any] = json.loads(json.dumps(BASE_CONF))
    for key in draw(st.lists(st.sampled_from(sorted(CONF_FIELDS)), unique=True, max_size=3)):
        if draw(st.integers(0, 5)) == 0:
            conf.pop(key, None)
        else:
            conf[key] = draw(CONF_FIELDS[key])
    conf.update(draw(st.dictionaries(json_keys, json_values, max_size=2)))
    return conf


@FUZZ
@given(netconfs())
def test_parse_netconf(raw):
    try:
        conf = parse_netconf(raw)
    except CniError as err:
        assert_decode_error(err)
        return
    assert conf.cni_version in cniversion.SUPPORTED
    assert name_problem(conf.name) is None, f"name={conf.name!r} accepted"
    assert isinstance(conf.type, str)
    for part in (conf.runtime_config, conf.args_cni, conf.ipam):
        assert isinstance(part, dict)
    if raw.get("prevResult") is not None:
        problems = prev_result_problems(raw["prevResult"])
        assert problems == [], f"prevResult accepted: {problems}"
        assert isinstance(conf.prev_result, Result)


@settings(FUZZ, max_examples=600)
@given(prev_results)
@example({"interfaces": [{"name": "net1", "mtu": math.inf}]})
@example({"routes": [{"dst": "0.0.0.0/0", "table": -math.inf}]})
@example({"ips": [{"address": "10.77.0.5/24", "interface": False}]})  # a bool is no index
@example({"ips": [{"address": "10.77.0.5/24", "version": False}]})
def test_prev_result_from_dict(raw):
    try:
        result = Result.from_dict(raw, "prevResult")
    except CniError as err:
        assert_decode_error(err, {PREV_RESULT_CODE})
        return
    problems = prev_result_problems(raw)
    assert problems == [], f"prevResult accepted: {problems}"
    # What was accepted can be emitted again, in every version.
    for version in cniversion.SUPPORTED:
        json.dumps(result.to_dict(version), allow_nan=False)


# ---- the frame: env + stdin in, one JSON document out -----------------------------------


def _handler(env, raw):
    """What `tenantnet.entry.plugin.dispatch` does before a plugin sees anything: parse the config."""
    conf = parse_netconf(raw)
    if env.command == "ADD":
        return {"cniVersion": conf.cni_version}
    return None


def assert_one_document(code: int, text: str) -> dict[str, Any] | None:
    assert isinstance(code, int)
    if not text:
        assert code == 0, f"exit code {code} without an error document"
        return None
    doc = json.loads(text)  # exactly one JSON document
    assert isinstance(doc, dict)
    if code != 0:
        assert set(doc) <= {"cniVersion", "code", "msg", "details"}, doc
        assert _is_int(doc.get("code")) and isinstance(doc.get("msg"), str), doc
        assert doc["cniVersion"] in cniversion.SUPPORTED, doc
    return doc


stdins = st.one_of(
    netconfs().map(lambda c: json.dumps(c).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=100),
    st.sampled_from([b"", b" ", b"{", b"\xff\xfe", b"\0", b"[]", b"null", b'"x"', b"{}" * 2]),
)


@FUZZ
@given(environs(), stdins)
def test_skel_run(environ, stdin):
    unexpected: list[BaseException] = []
    code, text = skel.run(_handler, environ, stdin, unexpected.append)
    doc = assert_one_document(code, text)
    assert not unexpected, f"handler raised {unexpected[0]!r}"
    if code != 0:
        assert doc is not None
        assert doc["code"] != 100, doc
        assert doc["code"] in DECODE_CODES, doc


@pytest.mark.parametrize("kind", ["list", "object"])
@pytest.mark.parametrize("command", ["ADD", "DEL", "FOO"])
def test_skel_run_deep_nesting(kind, command):
    unexpected: list[BaseException] = []
    code, text = skel.run(_handler, {**BASE_ENV, "CNI_COMMAND": command}, _nested(kind, 100_000),
                          unexpected.append)
    doc = assert_one_document(code, text)
    assert not unexpected, repr(unexpected[0])
    assert doc is not None and doc["code"] == (4 if command == "FOO" else 6), doc


@pytest.mark.parametrize("size,refused", [(MAX_STDIN, False), (MAX_STDIN + 1, True), (4 * MAX_STDIN, True)])
def test_skel_run_stdin_bound(size, refused):
    conf = json.dumps(BASE_CONF).encode()
    stdin = conf + b" " * (size - len(conf))
    assert len(stdin) == size
    code, text = skel.run(_handler, BASE_ENV, stdin)
    doc = assert_one_document(code, text)
    if refused:
        assert doc is not None and doc.get("code") == 6, doc
    else:
        assert code == 0, doc


def test_strategies_cover_what_they_should():
    """The strict checker itself: a plain valid result passes, typed mistakes do not."""
    good = {"cniVersion": "1.0.0", "interfaces": [{"name": "net1", "mac": "02:00:00:00:00:01", "mtu": 1500}],
            "ips": [{"address": "10.77.0.5/24", "gateway": "10.77.0.1", "interface": 0}],
            "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["10.0.0.53"]}}
    assert prev_result_problems(good) == []
    for bad in ({**good, "ips": [{"address": 5}]}, {**good, "interfaces": [{"name": "a", "mtu": "1500"}]},
                {**good, "routes": [{"dst": "0.0.0.0/0", "table": math.inf}]}, {**good, "ips": "x"}):
        assert prev_result_problems(bad) != []
    assert depth_of([]) == 1 and depth_of({"a": [1]}) == 2 and depth_of(1) == 0
