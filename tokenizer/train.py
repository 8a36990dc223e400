"""BPE training: stream files into pretoken counts, then merge with incremental pair counts.

Tie-break rule (the whole of what makes training deterministic):
  each step merges the pair of adjacent tokens with the highest count, summed over every
  occurrence in every pretoken weighted by how often the pretoken occurs; among equal
  counts, the pair with the smallest (left id, right id) wins. A pair whose merged bytes
  already are a token is never merged (every token has one byte string). Inside a
  pretoken, occurrences are merged left to right (in "aaa", (a, a) makes "aa" + "a").
The result depends only on the multiset of pretokens, not on file or block order.

Every position of every distinct pretoken is one slot of flat arrays; each pair keeps a
linked list of the positions where it starts, so a merge touches only its occurrences
and updates the counts of the pairs around them. The best pair comes from a lazy heap
(stale entries are skipped when popped).
"""

from __future__ import annotations

import codecs
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
from numba import njit

from euler.errors import EulerError

from .bytetable import (
    ByteTable,
    fnv1a,
    grown,
    new_table,
    table_add,
    table_find,
    table_room,
)
from .merge import pair_slot
from .pretokenize import char_classes, piece_end, safe_cuts

BLOCK_BYTES = 4 << 20  # files are read in blocks of about this size
SEARCH_BYTES = 1 << 16  # a block's cut is looked for in its last SEARCH_BYTES
BANNED, TOUCHED = 1, 2  # pair flags
# Starting capacities; every structure grows by doubling (tests shrink these to force it).
COUNTER_ENTRIES, COUNTER_KEY_BYTES = 1 << 16, 1 << 20
EXTRA_PAIRS = 1024  # pair slots beyond the number of positions


# ---------------------------------------------------------------- counting pretokens


@njit(cache=True, nogil=True)
def count_pieces(buf, start, classes, t):
    """Add the pretokens of buf[start:] to counter t; returns where it stopped (t full)."""
    i = start
    n = buf.size
    while i < n:
        j = piece_end(buf, i, n, classes)
        h = fnv1a(buf, i, j)
        e, s = table_find(t, buf, i, j, h)
        if e < 0:
            if not table_room(t, j - i, 0):
                return i
            e = table_add(t, buf, i, j, h, s)
        t.value[e] += 1
        i = j
    return n


def _blocks(path: Path):
    """Yield uint8 arrays of about BLOCK_BYTES read from path, cut only where the
    pretokens do not depend on context (safe_cuts), so counts equal the whole file's.

    The bytes must be UTF-8, as `euler data prepare` demands of its text: a binary file
    is refused by name and byte offset rather than learned from."""
    carry = b""
    utf8 = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        while data := f.read(BLOCK_BYTES):
            _check_utf8(utf8, data, offset, path)
            offset += len(data)
            buf = np.frombuffer(carry + data, np.uint8)
            cuts = safe_cuts(buf, max(1, buf.size - SEARCH_BYTES), buf.size - 1)
            if cuts.size == 0:
                carry = buf.tobytes()
                continue
            cut = int(cuts[-1])
            carry = buf[cut:].tobytes()
            yield buf[:cut]
    _check_utf8(utf8, b"", offset, path, final=True)
    if carry:
        yield np.frombuffer(carry, np.uint8)


def _check_utf8(decoder, data: bytes, offset: int, path: Path, final: bool = False) -> None:
    """Feed the next bytes of a file to an incremental UTF-8 decoder; EulerError at the
    first byte that is not UTF-8 (`offset`: where `data` starts in the file)."""
    pending = len(decoder.getstate()[0])  # bytes of a character cut at the last block end
    try:
        decoder.decode(data, final)
    except UnicodeDecodeError as e:
        raise EulerError(f"{path}: not UTF-8 (byte {offset - pending + e.start})") from None


@njit(cache=True, nogil=True)
def add_counts(a, b, start):
    """Add counter b's entries from `start` on into counter a; returns where it stopped
    (a full) or b's entry count when done."""
    for e in range(start, b.used[0]):
        i, j, h = b.key_start[e], b.key_start[e + 1], b.hashes[e]
        f, s = table_find(a, b.keys, i, j, h)
        if f < 0:
            if not table_room(a, j - i, 0):
                return e
            f = table_add(a, b.keys, i, j, h, s)
        a.value[f] += b.value[e]
    return b.used[0]


def _all_blocks(files: list[Path]):
    for path in files:
        try:
            yield from _blocks(path)
        except OSError as e:
            raise EulerError(f"cannot read {path}: {e.strerror}") from None


def count_pretokens(
    files: list[Path], on_bytes: Callable[[int], None], threads: int | None = None
) -> ByteTable:
    """Pretoken counts over all files, read block by block (the corpus is never held
    whole). `threads` threads (default: every core) each count blocks into their own
    table; the tables are summed at the end (which thread saw which block cannot change
    the counts)."""
    threads = threads or os.cpu_count() or 1
    classes = char_classes()
    blocks = _all_blocks(files)
    lock = threading.Lock()

    def work(_: int) -> ByteTable:
        t = new_table(COUNTER_ENTRIES, COUNTER_KEY_BYTES)
        while True:
            with lock:  # reading stays in order; counting runs without the GIL
                buf = next(blocks, None)
            if buf is None:
                return t
            i = 0
            while i < buf.size:
                i = count_pieces(buf, i, classes, t)
                if i < buf.size:
                    t = grown(t)
            on_bytes(buf.size)

    with ThreadPoolExecutor(threads) as pool:
        tables = list(pool.map(work, range(threads)))
    total = tables[0]
    for t in tables[1:]:
        e = 0
        while e < t.used[0]:
            e = add_counts(total, t, e)
            if e < t.used[0]:
                total = grown(total)
    return total


def check_inputs(files: list[str | Path]) -> list[Path]:
    """The input paths, or EulerError naming the first missing or empty one."""
    if not files:
        raise EulerError("no input files given")
    paths = [Path(f) for f in files]
    for p in paths:
        if not p.exists():
            raise EulerError(f"input file not found: {p}")
        if not p.is_file():
            raise EulerError(f"input is not a file: {p}")
        if p.stat().st_size == 0:
            raise EulerError(f"input file is empty: {p}")
    return paths


# ---------------------------------------------------------------- merging


class TrainState(NamedTuple):
    """Positions (N: all bytes of all distinct pretokens) and pairs (P slots, growable)."""

    sym: np.ndarray  # int32[N]: token at each live position
    nxt: np.ndarray  # int32[N]: next live position in the same pretoken, -1 at the end
    prv: np.ndarray  # int32[N]: previous live position, -1 at the start
    weight: np.ndarray  # int64[N]: occurrences of the pretoken holding this position
    pair_at: np.ndarray  # int32[N]: pair starting here, -1 if none
    lnext: np.ndarray  # int32[N]: next position in the same pair's list
    lprev: np.ndarray  # int32[N]: previous position in the same pair's list
    left: np.ndarray  # int32[P]: pair's left token
    right: np.ndarray  # int32[P]: pair's right token
    count: np.ndarray  # int64[P]: weighted occurrences
    head: np.ndarray  # int32[P]: first position in the pair's list, -1 if empty
    length: np.ndarray  # int64[P]: positions in the pair's list
    flag: np.ndarray  # uint8[P]: BANNED, TOUCHED
    slot_key: np.ndarray  # int64[S]: left << 32 | right, -1 empty (S >= 2 P)
    slot_pair: np.ndarray  # int32[S]: pair id in that slot
    heap: np.ndarray  # int32[H]: pair ids, best first; lazy
    heap_count: np.ndarray  # int64[H]: the pair's count when pushed
    touched: np.ndarray  # int32[P]: pairs whose count changed in this merge
    used: np.ndarray  # int64[2]: pairs, heap entries


def _pair_room(n_pairs: int) -> tuple[int, int]:
    return n_pairs, 1 << max(4, int(2 * n_pairs).bit_length())


def init_state(words: ByteTable) -> TrainState:
    """Lay out every distinct pretoken of a counter as positions and count its pairs."""
    n_words = int(words.used[0])
    n = int(words.used[1])
    sym = words.keys[:n].astype(np.int32)
    starts = words.key_start[: n_words + 1]
    lengths = np.diff(starts)
    idx = np.arange(n, dtype=np.int32)
    nxt = idx + 1
    nxt[starts[1:] - 1] = -1
    prv = idx - 1
    prv[starts[:-1]] = -1
    weight = np.repeat(words.value[:n_words], lengths)
    p, s = _pair_room(n + EXTRA_PAIRS)
    st = TrainState(
        sym=sym,
        nxt=nxt,
        prv=prv,
        weight=weight,
        pair_at=np.full(n, -1, np.int32),
        lnext=np.full(n, -1, np.int32),
        lprev=np.full(n, -1, np.int32),
        left=np.zeros(p, np.int32),
        right=np.zeros(p, np.int32),
        count=np.zeros(p, np.int64),
        head=np.full(p, -1, np.int32),
        length=np.zeros(p, np.int64),
        flag=np.zeros(p, np.uint8),
        slot_key=np.full(s, -1, np.int64),
        slot_pair=np.zeros(s, np.int32),
        heap=np.zeros(p, np.int32),
        heap_count=np.zeros(p, np.int64),
        touched=np.zeros(p, np.int32),
        used=np.zeros(2, np.int64),
    )
    _init_pairs(st)
    return st


def ensure_room(st: TrainState, pair: int) -> TrainState:
    """st, grown if merging `pair` could overflow its pair or heap arrays."""
    k = int(st.length[pair])
    n_pairs, n_heap = int(st.used[0]), int(st.used[1])
    need_pairs = n_pairs + 2 * k + 1
    need_heap = n_heap + 4 * k + 2
    if need_pairs <= st.left.size and need_heap <= st.heap.size:
        return st
    p, s = _pair_room(max(2 * st.left.size, need_pairs))
    h = max(2 * st.heap.size, 2 * need_heap)

    def grow(a: np.ndarray, size: int, fill: int = 0) -> np.ndarray:
        b = np.full(size, fill, a.dtype)
        b[: a.size] = a
        return b

    st = st._replace(
        left=grow(st.left, p),
        right=grow(st.right, p),
        count=grow(st.count, p),
        head=grow(st.head, p, -1),
        length=grow(st.length, p),
        flag=grow(st.flag, p),
        touched=grow(st.touched, p),
        slot_key=np.full(s, -1, np.int64),
        slot_pair=np.zeros(s, np.int32),
        heap=grow(st.heap, h),
        heap_count=grow(st.heap_count, h),
    )
    _reslot_pairs(st)
    return st


@njit(cache=True)
def _reslot_pairs(st):
    mask = st.slot_key.size - 1
    for pid in range(st.used[0]):
        key = (np.int64(st.left[pid]) << 32) | np.int64(st.right[pid])
        s = pair_slot(key, mask)
        while st.slot_key[s] != -1:
            s = (s + 1) & mask
        st.slot_key[s] = key
        st.slot_pair[s] = pid


@njit(cache=True)
def _pair_id(st, a, b):
    """Id of pair (a, b), added with count 0 if new (the caller ensured room)."""
    key = (np.int64(a) << 32) | np.int64(b)
    mask = st.slot_key.size - 1
    s = pair_slot(key, mask)
    while True:
        k = st.slot_key[s]
        if k == key:
            return st.slot_pair[s]
        if k == -1:
            break
        s = (s + 1) & mask
    pid = st.used[0]
    st.used[0] = pid + 1
    st.slot_key[s] = key
    st.slot_pair[s] = pid
    st.left[pid] = a
    st.right[pid] = b
    return pid


@njit(cache=True, inline="always")
def _better(st, p, cp, q, cq):
    """Pair p (count cp) ranks before pair q (count cq): higher count, then smaller ids."""
    if cp != cq:
        return cp > cq
    if st.left[p] != st.left[q]:
        return st.left[p] < st.left[q]
    return st.right[p] < st.right[q]


@njit(cache=True)
def _heap_push(st, pid):
    i = st.used[1]
    st.used[1] = i + 1
    c = st.count[pid]
    while i > 0:
        parent = (i - 1) >> 1
        if not _better(st, pid, c, st.heap[parent], st.heap_count[parent]):
            break
        st.heap[i] = st.heap[parent]
        st.heap_count[i] = st.heap_count[parent]
        i = parent
    st.heap[i] = pid
    st.heap_count[i] = c


@njit(cache=True)
def pop_best(st):
    """The pair to merge next (see the tie-break rule), or -1 when no pair is left."""
    while st.used[1] > 0:
        top = st.heap[0]
        top_count = st.heap_count[0]
        size = st.used[1] - 1
        st.used[1] = size
        pid = st.heap[size]
        c = st.heap_count[size]
        i = 0
        while True:
            child = 2 * i + 1
            if child >= size:
                break
            if child + 1 < size and _better(
                st,
                st.heap[child + 1],
                st.heap_count[child + 1],
                st.heap[child],
                st.heap_count[child],
            ):
                child += 1
            if not _better(st, st.heap[child], st.heap_count[child], pid, c):
                break
            st.heap[i] = st.heap[child]
            st.heap_count[i] = st.heap_count[child]
            i = child
        if size > 0:
            st.heap[i] = pid
            st.heap_count[i] = c
        if st.flag[top] & BANNED == 0 and st.count[top] == top_count and top_count > 0:
            return top
    return -1


@njit(cache=True, inline="always")
def _touch(st, pid, n_touched):
    if st.flag[pid] & TOUCHED == 0:
        st.flag[pid] |= TOUCHED
        st.touched[n_touched] = pid
        return n_touched + 1
    return n_touched


@njit(cache=True, inline="always")
def _link(st, pos, pid):
    st.pair_at[pos] = pid
    h = st.head[pid]
    st.lprev[pos] = -1
    st.lnext[pos] = h
    if h >= 0:
        st.lprev[h] = pos
    st.head[pid] = pos
    st.length[pid] += 1
    st.count[pid] += st.weight[pos]


@njit(cache=True, inline="always")
def _unlink(st, pos):
    pid = st.pair_at[pos]
    a = st.lprev[pos]
    b = st.lnext[pos]
    if a >= 0:
        st.lnext[a] = b
    else:
        st.head[pid] = b
    if b >= 0:
        st.lprev[b] = a
    st.length[pid] -= 1
    st.count[pid] -= st.weight[pos]
    st.pair_at[pos] = -1
    return pid


@njit(cache=True)
def _init_pairs(st):
    for pos in range(st.sym.size):
        q = st.nxt[pos]
        if q >= 0:
            _link(st, pos, _pair_id(st, st.sym[pos], st.sym[q]))
    for pid in range(st.used[0]):
        _heap_push(st, pid)


@njit(cache=True)
def apply_merge(st, pair, new_id):
    """Replace every occurrence of `pair` by token new_id, left to right in each pretoken."""
    positions = np.empty(st.length[pair], np.int32)
    pos = st.head[pair]
    k = 0
    while pos >= 0:
        positions[k] = pos
        k += 1
        pos = st.lnext[pos]
    positions.sort()  # positions of one pretoken are contiguous and increasing
    n_touched = 0
    for pos in positions:
        if st.pair_at[pos] != pair:  # consumed by the overlapping occurrence just left of it
            continue
        q = st.nxt[pos]
        x = st.prv[pos]
        y = st.nxt[q]
        if x >= 0:
            n_touched = _touch(st, _unlink(st, x), n_touched)
        _unlink(st, pos)
        if y >= 0:
            n_touched = _touch(st, _unlink(st, q), n_touched)
        st.sym[pos] = new_id
        st.nxt[pos] = y
        if y >= 0:
            st.prv[y] = pos
            pid = _pair_id(st, new_id, st.sym[y])
            _link(st, pos, pid)
            n_touched = _touch(st, pid, n_touched)
        if x >= 0:
            pid = _pair_id(st, st.sym[x], new_id)
            _link(st, x, pid)
            n_touched = _touch(st, pid, n_touched)
    st.flag[pair] |= BANNED
    for t in range(n_touched):
        pid = st.touched[t]
        st.flag[pid] &= ~np.uint8(TOUCHED)
        if st.count[pid] > 0 and st.flag[pid] & BANNED == 0:
            _heap_push(st, pid)


def learn_merges(
    words: ByteTable, n_merges: int, vocab: list[bytes], on_merge: Callable[[], None]
) -> list[tuple[int, int]]:
    """Up to n_merges merges (left id, right id) learned from pretoken counts.

    vocab: the bytes of the tokens before any merge (256 bytes, then the specials); merge r
    makes token len(vocab) + r, the bytes of its two parts joined.
    """
    st = init_state(words)
    vocab = list(vocab)
    first_id = len(vocab)
    known = set(vocab)
    merges: list[tuple[int, int]] = []
    while len(merges) < n_merges:
        pair = pop_best(st)
        if pair < 0:
            break
        a, b = int(st.left[pair]), int(st.right[pair])
        joined = vocab[a] + vocab[b]
        if joined in known:
            st.flag[pair] |= BANNED
            continue
        st = ensure_room(st, pair)
        apply_merge(st, pair, first_id + len(merges))
        merges.append((a, b))
        vocab.append(joined)
        known.add(joined)
        on_merge()
    return merges
