"""gpupack.scoring.names: candidate names read from their wire bytes, and name → reason maps written to bytes.

Each compiled loop is compared with what orjson and a dict say on random inputs.
"""

from __future__ import annotations

import json

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupack.scoring.names import NOT_STRICT, NameArray, NameIndex, RowReasons, json_string_spans, pack

# node names as Kubernetes writes them, plus characters JSON must escape and non-ASCII ones
plain_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=0, max_size=30)
any_names = st.one_of(plain_names, st.text(max_size=12))
spacing = st.sampled_from([(",", ":"), (", ", ": "), (" ,\n ", " : ")])


def rows_of(index: NameIndex, array: NameArray) -> list[int]:
    """The rows `index` finds for `array`, checked against the mask and the count of names not found."""
    mask = np.zeros(len(index.names), dtype=np.bool_)
    rows, missing = index.rows(array, mask)
    assert missing == int((rows < 0).sum())
    assert set(np.flatnonzero(mask).tolist()) == set(rows[rows >= 0].tolist())
    return rows.tolist()


def encode(names: list[str], separators: tuple[str, str], indent: int | None) -> bytes:
    return json.dumps(names, separators=separators, indent=indent, ensure_ascii=False).encode()


@settings(max_examples=300, deadline=None)
@given(
    inventory=st.lists(st.one_of(st.none(), any_names), max_size=40, unique_by=lambda s: s),
    extra=st.lists(any_names, max_size=10),
    picks=st.lists(st.integers(0, 1000), max_size=60),
    separators=spacing,
    indent=st.sampled_from([None, 2]),
)
def test_rows_are_what_a_dict_of_the_names_says(
    inventory: list[str | None], extra: list[str], picks: list[int], separators: tuple[str, str], indent: int | None
) -> None:
    pool = [n for n in inventory if n is not None] + extra
    sent = [pool[p % len(pool)] for p in picks] if pool else []
    data = encode(sent, separators, indent)
    array = NameArray.read(data)
    if any(not n.isascii() or orjson.dumps(n) != b'"' + n.encode() + b'"' for n in sent):
        assert array is None  # not ASCII, or escaped: the caller parses it the general way
        return
    assert array is not None and len(array) == len(sent)
    assert array.names() == sent and [array.name(i) for i in range(len(sent))] == sent
    index = NameIndex(inventory)
    where = {name: row for row, name in enumerate(inventory) if name is not None}
    assert rows_of(index, array) == [where.get(n, -1) for n in sent]
    for name in {*pool, ",", '","', ""}:
        assert (name in array) == (name in sent), name


@settings(max_examples=300, deadline=None)
@given(
    names=st.lists(plain_names, max_size=8),
    cut=st.integers(0, 400),
    insert=st.sampled_from([b"", b",", b'"', b"\\", b"]", b"[", b"}", b" ", b"\x01", b"x", b'""']),
    drop=st.integers(0, 3),
    closing=st.booleans(),
)
def test_what_is_accepted_is_exactly_what_orjson_reads(
    names: list[str], cut: int, insert: bytes, drop: int, closing: bool
) -> None:
    """Byte-level damage to an array: NameArray never accepts what orjson would reject or read otherwise."""
    data = orjson.dumps(names) + (b" }" if closing else b"")
    at = cut % (len(data) + 1)
    damaged = data[:at] + insert + data[at + drop :]
    array = NameArray.read(damaged, closing=closing)
    if array is None:
        return
    text = damaged.rstrip()
    if closing:
        assert text.endswith(b"}")
        text = text[:-1]
    assert orjson.loads(text) == array.names()
    assert all(isinstance(n, str) for n in array.names())


def test_an_array_may_start_after_other_bytes_and_must_end_the_body() -> None:
    data = b'{"Pod":{},"NodeNames" : [ "a" , "b" ] }\n'
    array = NameArray.read(data, data.index(b":", 20) + 1, closing=True)
    assert array is not None and array.names() == ["a", "b"]
    assert NameArray.read(data[:-3], data.index(b":", 20) + 1, closing=True) is None  # no closing brace
    assert NameArray.read(b'["a"] x') is None
    assert NameArray.read(b'["a"]} ', closing=False) is None
    empty = NameArray.read(b"[]")
    assert empty is not None and empty.names() == []
    three = np.frombuffer(b'["a","b","c"]', dtype=np.uint8)
    hashes = np.empty(3, dtype=np.uint64)
    assert json_string_spans(three, 0, 0, np.empty((2, 2), dtype=np.int64), hashes) == NOT_STRICT  # never past
    assert json_string_spans(three, 0, 0, np.empty((3, 2), dtype=np.int64), hashes[:2]) == NOT_STRICT
    assert json_string_spans(three, 0, 0, np.empty((3, 2), dtype=np.int64), hashes) == 3


@settings(max_examples=200, deadline=None)
@given(
    inventory=st.lists(any_names, min_size=1, max_size=30, unique=True),
    choice=st.lists(st.tuples(st.integers(0, 100), st.integers(0, 2)), max_size=30),
)
def test_reasons_are_written_as_orjson_writes_the_map(inventory: list[str], choice: list[tuple[int, int]]) -> None:
    index = NameIndex(inventory)
    texts = ("gpupack chose another node", 'with "quotes" and \\', "ünïcode")
    picked = {p % len(inventory): code for p, code in choice}  # one reason per node, as in FailedNodes
    rows = np.array(sorted(picked), dtype=np.int64)
    codes = np.array([picked[r] for r in rows.tolist()], dtype=np.int8)
    reasons = RowReasons(index, rows, codes, texts)
    expected = {inventory[r]: texts[picked[r]] for r in rows.tolist()}
    assert dict(reasons) == expected and len(reasons) == len(expected)
    assert orjson.loads(b"{" + reasons.members_json() + b"}") == expected
    # the index keeps the last answer; a different map must not get it
    other = RowReasons(index, rows, (codes + 1) % 3, texts)
    assert orjson.loads(b"{" + other.members_json() + b"}") == {
        inventory[r]: texts[(picked[r] + 1) % 3] for r in rows.tolist()
    }
    assert orjson.loads(b"{" + reasons.members_json() + b"}") == expected


@settings(max_examples=200, deadline=None)
@given(strings=st.lists(st.one_of(st.none(), any_names), max_size=30))
def test_pack_holds_each_string_as_orjson_writes_it(strings: list[str | None]) -> None:
    blob, offsets = pack(strings)
    held = [bytes(blob[offsets[i] : offsets[i + 1]]) for i in range(len(strings))]
    assert held == [b"" if s is None else orjson.dumps(s) for s in strings]


def test_a_matching_hash_is_not_enough_every_byte_is_compared() -> None:
    """A name whose hash matches a row's but whose bytes differ must not resolve to that row. Hash
    collisions are too rare to meet at random, so the row's stored length and words are altered."""
    long_name = "ip-10-0-12-34.eu-west-1.compute.internal"  # five eight-byte words
    for name, column in [("node-a", 0), ("node-a", 1), ("gpu-node-17", 2), (long_name, 2), (long_name, 5)]:
        array = NameArray.read(orjson.dumps([name]))
        assert array is not None
        index = NameIndex([name])
        assert rows_of(index, array) == [0]
        index.words[0, column] ^= np.uint64(1)  # column 0: the length; then the name's words
        assert rows_of(index, array) == [-1], (name, column)


def test_every_byte_value_at_every_position_of_a_long_name_reads_as_orjson_reads_it() -> None:
    """Strings are scanned eight bytes at a time: a byte that ends or refuses the string is caught in
    any lane of a word, and one that does neither is content wherever it sits."""
    for position in range(20):
        for value in range(256):
            name = bytearray(b"abcdefghijklmnopqrst")
            name[position] = value
            data = b'["' + bytes(name) + b'","tail-name-0123456789"]'
            array = NameArray.read(data)
            plain = 0x20 <= value < 0x80 and value not in b'"\\'
            assert (array is not None) == plain, (position, value)  # the others: read the general way
            if array is not None:
                assert array.names() == orjson.loads(data), (position, value)


def test_names_made_of_separators_are_held_exactly() -> None:
    """`","` is both the JSON of the name "," and the separator between two names (found by hypothesis)."""
    for inventory in ([","], ["a", ","], [",", "b"], ["a", ",", "", ",,", "b"]):
        blob, offsets = pack(inventory)
        held = [blob[offsets[i] : offsets[i + 1]].tobytes() for i in range(len(inventory))]
        assert held == [orjson.dumps(name) for name in inventory]
        array = NameArray.read(orjson.dumps(inventory[::-1]))
        assert array is not None
        assert rows_of(NameIndex(inventory), array) == list(range(len(inventory)))[::-1]
