"""Node names as bytes: find inventory rows for a JSON array of names, and write name → reason maps.

kube-scheduler sends thousands of candidate names per call, in a different order each time (its
filter runs in parallel). Turning them into Python strings and hashing each one costs more than
scoring the nodes, so `NameIndex` resolves them straight from the request's bytes, and writes
the per-node answer map straight to bytes, in compiled loops.

Names are held JSON-encoded (with their quotes), exactly as they appear on the wire. Only the strict
form is read here: a JSON array of ASCII strings without escapes or control characters; anything
else (`json_string_spans` returns NOT_STRICT) is for the caller to read the general way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache

import numpy as np
import orjson
from numba import njit

NOT_STRICT = -1
HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
HASH_SEED = np.uint64(0x243F6A8885A308D3)
_LOW_BITS = np.uint64(0x0101010101010101)
_HIGH_BITS = np.uint64(0x8080808080808080)
_QUOTE, _BACKSLASH, _COMMA = 0x22, 0x5C, 0x2C
_OPEN, _CLOSE, _BRACE_CLOSE = 0x5B, 0x5D, 0x7D
_PLAIN, _ENDS, _REFUSED = 0, 1, 2  # what a byte inside a strict string is: content, its end, not allowed
_BYTE_KIND = np.zeros(256, dtype=np.uint8)
_BYTE_KIND[:0x20] = _REFUSED
_BYTE_KIND[_BACKSLASH] = _REFUSED
_BYTE_KIND[0x80:] = _REFUSED  # names are ASCII: anything else is read the general way
_BYTE_KIND[_QUOTE] = _ENDS


@njit(cache=True, inline="always")
def _skip_space(buf: np.ndarray, i: int) -> int:
    while i < buf.shape[0] and (buf[i] == 0x20 or buf[i] == 0x0A or buf[i] == 0x0D or buf[i] == 0x09):
        i += 1
    return i


@njit(cache=True, nogil=True)
def json_string_spans(buf: np.ndarray, begin: int, closing: int, spans: np.ndarray, hashes: np.ndarray) -> int:
    """Read `[ "a", "b", ... ]` from `buf[begin:]`; the element count, or NOT_STRICT.

    `spans[i]` gets the start and end of element i's content (between its quotes), `hashes[i]` its
    `_hash`, computed on the way: strings are read eight bytes at a time. After the array only whitespace may
    follow, or, when `closing` is 1, whitespace, one `}` and whitespace (the array is the last member
    of an object). Strings must be ASCII without `\\` or bytes below 0x20. `spans` and `hashes` need
    `(len(buf) - begin) // 3 + 1` rows for every array to fit (more elements: NOT_STRICT).
    """
    n = buf.shape[0]
    i = _skip_space(buf, begin)
    if i >= n or buf[i] != _OPEN:
        return NOT_STRICT
    i = _skip_space(buf, i + 1)
    count = 0
    if i < n and buf[i] == _CLOSE:
        i += 1
    else:
        while True:
            if i >= n or buf[i] != _QUOTE:
                return NOT_STRICT
            start = i + 1
            i = start
            h = HASH_SEED
            while i + 8 <= n:  # eight bytes at a time while none of them ends the string or is refused
                word = _word(buf, i, i + 8)
                if _special_bytes(word) != 0:
                    break
                h = (h ^ word) * HASH_MULTIPLIER
                i += 8
            last = i  # the last, partial word: byte by byte
            while i < n and _BYTE_KIND[buf[i]] == _PLAIN:
                i += 1
            if i == n or _BYTE_KIND[buf[i]] != _ENDS or count == spans.shape[0] or count == hashes.shape[0]:
                return NOT_STRICT
            if i > last:
                h = (h ^ _word(buf, last, i)) * HASH_MULTIPLIER
            spans[count, 0] = start
            spans[count, 1] = i
            hashes[count] = _finish_hash(h, i - start)
            count += 1
            i += 1
            if i < n and buf[i] == _COMMA:  # compact JSON, the common case: no call to skip spaces
                i += 1
                if i < n and buf[i] != _QUOTE:
                    i = _skip_space(buf, i)
                continue
            i = _skip_space(buf, i)
            if i < n and buf[i] == _COMMA:
                i = _skip_space(buf, i + 1)
                continue
            if i < n and buf[i] == _CLOSE:
                i += 1
                break
            return NOT_STRICT
    i = _skip_space(buf, i)
    if closing == 1:
        if i >= n or buf[i] != _BRACE_CLOSE:
            return NOT_STRICT
        i = _skip_space(buf, i + 1)
    return count if i == n else NOT_STRICT


@njit(cache=True, inline="always")
def _word(buf: np.ndarray, i: int, end: int) -> np.uint64:
    """Bytes i .. min(i + 8, end) - 1 of `buf`, little-endian, zero-padded (0 <= i <= end <= len(buf))."""
    at = np.uintp(i)  # unsigned: no negative-index wraparound, so the compiler makes eight bytes one load
    if end - i >= 8:
        return (
            np.uint64(buf[at]) | np.uint64(buf[at + np.uintp(1)]) << np.uint64(8)
            | np.uint64(buf[at + np.uintp(2)]) << np.uint64(16) | np.uint64(buf[at + np.uintp(3)]) << np.uint64(24)
            | np.uint64(buf[at + np.uintp(4)]) << np.uint64(32) | np.uint64(buf[at + np.uintp(5)]) << np.uint64(40)
            | np.uint64(buf[at + np.uintp(6)]) << np.uint64(48) | np.uint64(buf[at + np.uintp(7)]) << np.uint64(56)
        )  # fmt: skip
    word = np.uint64(0)
    for j in range(end - i):
        word |= np.uint64(buf[at + np.uintp(j)]) << np.uint64(8 * j)
    return word


@njit(cache=True, inline="always")
def _special_bytes(word: np.uint64) -> np.uint64:
    """Nonzero when a byte of `word` is a quote, a backslash, below 0x20 or above 0x7F (exact as to
    whether one is; which one it is, the caller finds byte by byte)."""
    quote = word ^ (np.uint64(_QUOTE) * _LOW_BITS)
    backslash = word ^ (np.uint64(_BACKSLASH) * _LOW_BITS)
    return (
        ((quote - _LOW_BITS) & ~quote) | ((backslash - _LOW_BITS) & ~backslash)
        | ((word - np.uint64(0x20) * _LOW_BITS) & ~word) | word
    ) & _HIGH_BITS  # fmt: skip


@njit(cache=True, inline="always")
def _finish_hash(h: np.uint64, length: int) -> np.uint64:
    h = (h ^ np.uint64(length)) * HASH_MULTIPLIER
    h ^= h >> np.uint64(32)  # the table takes the low bits, which a multiply alone leaves weak
    h *= HASH_MULTIPLIER
    return h ^ (h >> np.uint64(29))


@njit(cache=True, inline="always")
def _hash(buf: np.ndarray, start: int, end: int) -> np.uint64:
    """A 64-bit hash of `buf[start:end]`: one multiply per eight-byte word, then the length."""
    h = HASH_SEED
    for i in range(start, end, 8):
        h = (h ^ _word(buf, i, end)) * HASH_MULTIPLIER
    return _finish_hash(h, end - start)


TAG_MASK = np.uint64(0xFFFFFFFF00000000)  # a slot: the hash's high 32 bits, then row + 1 (0: empty)
ROW_MASK = np.uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def rows_of_spans(
    buf: np.ndarray, spans: np.ndarray, hashes: np.ndarray, count: int, slots: np.ndarray, words: np.ndarray,
    rows: np.ndarray, mask: np.ndarray,
) -> int:
    """`rows[i]` = the row whose name is element i of `buf` (see `json_string_spans`), or -1; sets
    `mask[row]` for each row found; returns how many elements were not found.

    A row matches when its hash tag, its length (`words[row, 0]`) and every eight-byte word of its
    name (`words[row, 1:]`) are equal: exact. The slots are 8 bytes each and a name's length and
    words sit together, so a lookup touches two small places in memory.
    """  # fmt: skip
    table = np.uint64(slots.shape[0] - 1)
    missing = 0
    for e in range(count):
        start = spans[e, 0]
        end = spans[e, 1]
        length = end - start
        h = hashes[e]
        tag = h & TAG_MASK
        slot = h & table
        found = np.int64(-1)
        while slots[slot] != 0:
            if slots[slot] & TAG_MASK == tag:
                row = (slots[slot] & ROW_MASK) - np.uint64(1)  # unsigned: indexes without wraparound checks
                if np.int64(words[row, 0]) == length:
                    same = True
                    for k in range((length + 7) // 8):
                        if words[row, np.uintp(1 + k)] != _word(buf, start + 8 * k, end):
                            same = False
                            break
                    if same:
                        found = np.int64(row)
                        break
            slot = (slot + np.uint64(1)) & table
        rows[e] = found
        if found >= 0:
            mask[found] = True
        else:
            missing += 1
    return missing


@njit(cache=True, nogil=True)
def reasons_json(
    rows: np.ndarray, codes: np.ndarray, blob: np.ndarray, offsets: np.ndarray,
    reason_blob: np.ndarray, reason_offsets: np.ndarray,
) -> np.ndarray:
    """`"name":"reason",...` for each `rows[i]` with reason `codes[i]` (the members of a JSON object)."""
    size = 0
    for i in range(rows.shape[0]):
        size += offsets[rows[i] + 1] - offsets[rows[i]] + reason_offsets[codes[i] + 1] - reason_offsets[codes[i]] + 2
    out = np.empty(max(size - 1, 0), dtype=np.uint8)
    at = 0
    for i in range(rows.shape[0]):
        if i > 0:
            out[at] = _COMMA
            at += 1
        for j in range(offsets[rows[i]], offsets[rows[i] + 1]):
            out[at] = blob[j]
            at += 1
        out[at] = 0x3A  # ':'
        at += 1
        for j in range(reason_offsets[codes[i]], reason_offsets[codes[i] + 1]):
            out[at] = reason_blob[j]
            at += 1
    return out


def pack(strings: Sequence[str | None]) -> tuple[np.ndarray, np.ndarray]:
    """(blob, offsets): the JSON encoding of each string back to back; None packs as nothing.

    One orjson call for the whole list: per-string calls cost ~2 us each (10 ms at 5,000 nodes).
    """
    present = [text for text in strings if text is not None]
    data = orjson.dumps(present)
    spans = np.empty((len(present) + 1, 2), dtype=np.int64)
    hashes = np.empty(len(present) + 1, dtype=np.uint64)
    if json_string_spans(np.frombuffer(data, dtype=np.uint8), 0, 0, spans, hashes) == len(present):
        blob = ('"' + '""'.join(present) + '"').encode() if present else b""  # strict: each is "name"
        sizes = [len(text) + 2 for text in present]  # ASCII without escapes: one byte per character
    else:
        encoded = [orjson.dumps(text) for text in present]
        blob, sizes = b"".join(encoded), [len(e) for e in encoded]
    row_sizes = np.zeros(len(strings), dtype=np.int64)
    row_sizes[[i for i, text in enumerate(strings) if text is not None]] = sizes
    offsets = np.zeros(len(strings) + 1, dtype=np.int64)
    np.cumsum(row_sizes, out=offsets[1:])
    return np.frombuffer(blob, dtype=np.uint8).copy(), offsets


class NameIndex:
    """Inventory names laid out for `rows_of_spans` and `reasons_json` (rows with None hold no name)."""

    def __init__(self, names: Sequence[str | None]) -> None:
        self.names = list(names)
        self.blob, self.offsets = pack(self.names)
        lengths = np.diff(self.offsets) - 2  # of each name's content, between its quotes; -1: no name
        width = 1 + max(2, (int(lengths.max(initial=0)) + 7) // 8)
        self.words = np.zeros((len(self.names), width), dtype=np.uint64)  # length, then the name's words
        # at most a quarter full: a lookup mostly finds its name in the first slot it tries
        self.slots = np.zeros(1 << max(4, (4 * len(self.names)).bit_length()), dtype=np.uint64)
        fill_slots(self.blob, self.offsets, self.words, self.slots)
        self.last_members: tuple[np.ndarray, np.ndarray, tuple[str, ...], bytes] | None = None  # RowReasons'

    def rows(self, names: NameArray, mask: np.ndarray) -> tuple[np.ndarray, int]:
        """(the row of each name, -1 where the index has none; how many have none), setting `mask`
        at every row found (`mask` spans the index's rows)."""
        rows = np.empty(names.count, dtype=np.int64)
        missing = rows_of_spans(names.buf, names.spans, names.hashes, names.count, self.slots, self.words, rows, mask)
        return rows, missing


@njit(cache=True)
def fill_slots(blob: np.ndarray, offsets: np.ndarray, words: np.ndarray, slots: np.ndarray) -> None:
    """Each named row's length and words, and its slot: open addressing, linear probing from its hash."""
    mask = np.uint64(slots.shape[0] - 1)
    for row in range(offsets.shape[0] - 1):
        if offsets[row + 1] - offsets[row] < 2:
            continue  # no name
        start = offsets[row] + 1
        end = offsets[row + 1] - 1
        words[row, 0] = end - start
        for k in range((end - start + 7) // 8):
            words[row, 1 + k] = _word(blob, start + 8 * k, end)
        h = _hash(blob, start, end)
        slot = h & mask
        while slots[slot] != 0:
            slot = (slot + np.uint64(1)) & mask
        slots[slot] = (h & TAG_MASK) | np.uint64(row + 1)


class NameArray:
    """A JSON array of names in its wire bytes, read in the strict form (see the module docstring)."""

    __slots__ = ("begin", "buf", "count", "data", "end", "hashes", "spans")

    def __init__(self, data: bytes, spans: np.ndarray, hashes: np.ndarray, count: int, begin: int) -> None:
        self.data = data
        self.buf = np.frombuffer(data, dtype=np.uint8)
        self.spans = spans
        self.hashes = hashes
        self.count = count
        self.begin = begin
        self.end = data.rindex(b"]") + 1  # only whitespace and at most one `}` follow the array

    @classmethod
    def read(cls, data: bytes, begin: int = 0, closing: bool = False) -> NameArray | None:
        """The array at `data[begin:]` (followed by one `}` if `closing`), None if not in the strict form."""
        room = (len(data) - begin) // 3 + 1  # an element takes at least three bytes: `"",`
        spans = np.empty((room, 2), dtype=np.int64)
        hashes = np.empty(room, dtype=np.uint64)
        count = json_string_spans(np.frombuffer(data, dtype=np.uint8), begin, 1 if closing else 0, spans, hashes)
        return None if count == NOT_STRICT else cls(data, spans, hashes, count, begin)

    def __len__(self) -> int:
        return self.count

    def name(self, i: int) -> str:
        """Element i."""
        return self.data[self.spans[i, 0] : self.spans[i, 1]].decode()

    def names(self) -> list[str]:
        """Every element, in order."""
        return orjson.loads(self.data[self.begin : self.end])

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        needle = orjson.dumps(name)
        starts = self.spans[: self.count, 0]
        at = self.data.find(needle, self.begin, self.end)
        while at >= 0:  # a match must be a whole element, not the end of one and the start of the next
            i = int(np.searchsorted(starts, at + 1))
            if i < self.count and starts[i] == at + 1 and self.spans[i, 1] == at + len(needle) - 1:
                return True
            at = self.data.find(needle, at + 1, self.end)
        return False


class RowReasons(Mapping[str, str]):
    """A node name → reason map held as inventory rows and reason codes (`texts[code]` is the reason).

    `members_json` writes it without building the dict; reading it as a mapping builds the dict once.
    """

    def __init__(self, index: NameIndex, rows: np.ndarray, codes: np.ndarray, texts: tuple[str, ...]) -> None:
        self.index = index
        self.rows = rows
        self.codes = codes
        self.texts = texts
        self._dict: dict[str, str] | None = None

    def members_json(self) -> bytes:
        """The map's members as JSON, without the braces.

        The index keeps the last answer: kube-scheduler sends the same candidates call after call
        (in another order, which the rows no longer show) and bin-packing keeps choosing the same
        node until it is full, so consecutive answers are often byte for byte the same.
        """
        held = self.index.last_members
        if (
            held is not None
            and held[2] == self.texts
            and np.array_equal(held[0], self.rows)
            and np.array_equal(held[1], self.codes)
        ):
            return held[3]
        reason_blob, reason_offsets = _packed_texts(self.texts)
        members = reasons_json(
            self.rows, self.codes.astype(np.int64), self.index.blob, self.index.offsets, reason_blob, reason_offsets
        ).tobytes()
        self.index.last_members = (self.rows, self.codes, self.texts, members)
        return members

    def _as_dict(self) -> dict[str, str]:
        if self._dict is None:
            names, texts = self.index.names, self.texts
            pairs = zip(self.rows.tolist(), self.codes.tolist(), strict=True)
            self._dict = {names[row]: texts[code] for row, code in pairs}
        return self._dict

    def __getitem__(self, name: str) -> str:
        return self._as_dict()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._as_dict())

    def __len__(self) -> int:
        return len(self.rows)


@lru_cache(maxsize=16)
def _packed_texts(texts: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    return pack(texts)
