"""The stdlib-backed parser for ovs's JSON-RPC stream: same values as ovs's own parser, exact
byte accounting for `ovs.jsonrpc`, whatever the chunking."""

from __future__ import annotations

import json
import random

import pytest

from tenantnet.plugin.system import ovsjson

MESSAGES = [
    {"id": 7, "result": [{"uuid": ["uuid", "0b7c3b1e-1111-4d2a-9b0e-2f7f5a0f0001"]}, {}], "error": None},
    {"method": "update3", "id": None,
     "params": [["monid", "Open_vSwitch"], "00000000-0000-0000-0000-000000000000",
                {"Port": {"a6c1": {"insert": {"name": "tn0123456789a", "tag": 100,
                                              "external_ids": ["map", [["note", 'braces { } [ ] "quoted" \\ end'],
                                                                       ["tenantnet-owner", "tenantnet"]]]}}}}]},
    {"method": "echo", "params": [], "id": "echo"},
    {"id": 8, "result": [{"rows": [{"name": "ünïcødé-€", "n": -1.5e3, "ok": True, "none": None}]}],
     "error": None},
    [1, [2, [3, {"deep": "\\\\"}]]],
]


def stream_of(messages: list) -> str:
    return "".join(json.dumps(m, ensure_ascii=False) + random.choice(["", " ", "\n"]) for m in messages)


def read_all(text: str, chunk_sizes: list[int]) -> list:
    """What ovs.jsonrpc.Connection.recv does with a C-slot parser: feed the whole unconsumed
    input, drop as many UTF-8 bytes as `feed` says, new parser per message."""
    values, pending, parser = [], "", None
    chunks = []
    pos = 0
    for size in chunk_sizes:
        if pos >= len(text):
            break
        chunks.append(text[pos:pos + size])
        pos += size
    if pos < len(text):
        chunks.append(text[pos:])
    for chunk in chunks:
        pending += chunk
        while pending:
            if parser is None:
                parser = ovsjson.Parser()
            pending = pending.encode()[parser.feed(pending):].decode()
            if parser.is_done():
                values.append(parser.finish())
                parser = None
    assert not pending.strip()
    return values


@pytest.mark.parametrize("seed", range(40))
def test_any_chunking_gives_the_messages_back(seed: int) -> None:
    random.seed(seed)
    text = stream_of(MESSAGES)
    sizes = [random.choice([1, 2, 3, 7, 64, 4096]) for _ in range(len(text))]
    assert read_all(text, sizes) == MESSAGES


def test_escape_split_exactly_at_a_chunk_boundary() -> None:
    text = json.dumps({"v": 'a\\"}b'})  # {"v": "a\\\"}b"}
    cut = text.index("\\") + 1  # the chunk ends right after the first backslash
    for first in range(1, len(text)):
        assert read_all(text, [first, len(text)]) == [{"v": 'a\\"}b'}]
    assert read_all(text, [cut, 1, 1, 1, 100]) == [{"v": 'a\\"}b'}]


def test_same_values_as_ovs_own_parser() -> None:
    import ovs.json

    ovs_parser = object.__new__(ovs.json.Parser)  # the pure-Python one, whatever slot is filled
    ovs_parser.__init__()  # type: ignore[misc]
    text = json.dumps(MESSAGES[1])
    ovs_parser.feed(text)
    ours = ovsjson.Parser()
    ours.feed(text)
    assert ours.finish() == ovs_parser.finish() == MESSAGES[1]


@pytest.mark.parametrize(("text", "error"), [
    ('{"a": tru}', "invalid JSON"),
    ("42", "must be an object or an array"),
    ('"just a string"', "must be an object or an array"),
])
def test_bad_input_is_an_error_string(text: str, error: str) -> None:
    parser = ovsjson.Parser()
    parser.feed(text)
    assert parser.is_done()
    result = parser.finish()
    assert isinstance(result, str) and error in result


def test_incomplete_and_empty_input() -> None:
    parser = ovsjson.Parser()
    assert parser.feed('{"a": [1, 2') == len('{"a": [1, 2')
    assert not parser.is_done()
    assert parser.finish() == "unexpected end of input"
    empty = ovsjson.Parser()
    assert empty.feed("   \n") == 4
    assert empty.finish() == "empty input stream"


def test_check_trailer_refuses_garbage_after_the_value() -> None:
    strict = ovsjson.Parser(check_trailer=True)
    strict.feed('{"a": 1} x')
    assert strict.finish() == "trailing garbage at end of input"
    relaxed = ovsjson.Parser()
    assert relaxed.feed('{"a": 1} x') == len('{"a": 1}')
    assert relaxed.finish() == {"a": 1}


def test_install_fills_ovs_accelerator_slot() -> None:
    import ovs.json

    assert ovsjson.install()
    assert ovs.json.PARSER == ovs.json.PARSER_C
    assert isinstance(ovs.json.Parser(), ovsjson.Parser)
    assert ovs.json.from_string('{"x": [1, "two"]}') == {"x": [1, "two"]}
    assert ovsjson.install()  # idempotent
