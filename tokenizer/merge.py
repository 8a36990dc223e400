"""Applying learned merges: the compiled encode loop (pretokens, cache, merge by rank).

Rule kept here: a pretoken's bytes are merged by repeatedly taking the pair of adjacent
tokens with the lowest merge rank, the leftmost one on ties. Because a merge only ever
creates a token that later merges consume, this equals GPT-2's "merge every occurrence
of the best pair, left to right" (tests check against that written plainly in Python).
Short pretokens use a rescanned rank array; long ones a heap over a linked list, so a
10 MB pretoken costs O(n log n), not O(n^2).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .bytetable import fnv1a, table_add, table_clear, table_find, table_room
from .pretokenize import piece_end

CACHED_PIECE = 64  # bytes; longer pretokens are not cached and take the heap path


def pair_table(merges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hash table of the merges, int32[M, 2] -> (keys int64[S], ranks int32[S]).

    Key of pair (a, b) is a << 32 | b; empty slots hold -1. Rank r makes token first_id + r.
    """
    size = 1 << max(4, int(2 * len(merges)).bit_length())
    keys = np.full(size, -1, np.int64)
    ranks = np.zeros(size, np.int32)
    _fill_pairs(keys, ranks, merges.astype(np.int64))
    return keys, ranks


@njit(cache=True, inline="always")
def pair_slot(key, mask):
    """Home slot of pair key (a << 32 | b) in a table of mask + 1 slots (Fibonacci hash)."""
    return np.int64((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)) & mask


@njit(cache=True)
def _fill_pairs(keys, ranks, merges):
    mask = keys.size - 1
    for r in range(merges.shape[0]):
        key = (merges[r, 0] << 32) | merges[r, 1]
        s = pair_slot(key, mask)
        while keys[s] != -1:
            s = (s + 1) & mask
        keys[s] = key
        ranks[s] = r


@njit(cache=True, inline="always")
def rank_of(keys, ranks, a, b):
    """Merge rank of pair (a, b), or -1 when the pair is not a merge."""
    key = (np.int64(a) << 32) | np.int64(b)
    mask = keys.size - 1
    s = pair_slot(key, mask)
    while True:
        k = keys[s]
        if k == key:
            return np.int64(ranks[s])
        if k == -1:
            return np.int64(-1)
        s = (s + 1) & mask


@njit(cache=True)
def merge_small(ids, n, keys, ranks, first_id):
    """Merge ids[:n] in place by rank (lowest first, leftmost on ties); returns the new n."""
    pr = np.empty(max(n - 1, 1), np.int64)  # rank of pair (ids[p], ids[p+1]), -1 if none
    for p in range(n - 1):
        pr[p] = rank_of(keys, ranks, ids[p], ids[p + 1])
    while n > 1:
        best = np.int64(-1)
        at = -1
        for p in range(n - 1):
            r = pr[p]
            if r >= 0 and (best < 0 or r < best):
                best = r
                at = p
        if at < 0:
            break
        ids[at] = first_id + best
        for p in range(at + 1, n - 1):
            ids[p] = ids[p + 1]
        for p in range(at + 1, n - 2):
            pr[p] = pr[p + 1]
        n -= 1
        if at + 1 < n:
            pr[at] = rank_of(keys, ranks, ids[at], ids[at + 1])
        if at > 0:
            pr[at - 1] = rank_of(keys, ranks, ids[at - 1], ids[at])
    return n


@njit(cache=True, inline="always")
def _heap_push(heap, size, key):
    i = size
    heap[i] = key
    while i > 0:
        parent = (i - 1) >> 1
        if heap[parent] <= heap[i]:
            break
        heap[parent], heap[i] = heap[i], heap[parent]
        i = parent
    return size + 1


@njit(cache=True, inline="always")
def _heap_pop(heap, size):
    top = heap[0]
    size -= 1
    heap[0] = heap[size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and heap[c + 1] < heap[c]:
            c += 1
        if heap[i] <= heap[c]:
            break
        heap[i], heap[c] = heap[c], heap[i]
        i = c
    return top, size


@njit(cache=True)
def merge_large(ids, n, keys, ranks, first_id):
    """merge_small's result in O(n log n): a min-heap of (rank, position) over a linked list."""
    nxt = np.empty(n, np.int64)
    prv = np.empty(n, np.int64)
    for p in range(n):
        nxt[p] = p + 1 if p + 1 < n else -1
        prv[p] = p - 1
    alive = np.ones(n, np.bool_)
    heap = np.empty(3 * n, np.int64)  # n-1 initial pairs + at most 2 per merge
    size = 0
    for p in range(n - 1):
        r = rank_of(keys, ranks, ids[p], ids[p + 1])
        if r >= 0:
            size = _heap_push(heap, size, (r << 32) | p)
    while size > 0:
        top, size = _heap_pop(heap, size)
        r = top >> 32
        p = top & 0xFFFFFFFF
        q = nxt[p]
        # Stale entry: p was merged away, or its pair changed since it was pushed.
        if not alive[p] or q < 0 or rank_of(keys, ranks, ids[p], ids[q]) != r:
            continue
        ids[p] = first_id + r
        alive[q] = False
        nq = nxt[q]
        nxt[p] = nq
        if nq >= 0:
            prv[nq] = p
            r2 = rank_of(keys, ranks, ids[p], ids[nq])
            if r2 >= 0:
                size = _heap_push(heap, size, (r2 << 32) | p)
        pp = prv[p]
        if pp >= 0:
            r2 = rank_of(keys, ranks, ids[pp], ids[p])
            if r2 >= 0:
                size = _heap_push(heap, size, (r2 << 32) | pp)
    m = 0
    p = 0
    while p >= 0:
        ids[m] = ids[p]
        m += 1
        p = nxt[p]
    return m


@njit(cache=True, nogil=True)
def encode_spans(buf, starts, classes, keys, ranks, first_id, cache, out, out_starts):
    """Encode each span buf[starts[d]:starts[d+1]] of uint8 buf into int32 token ids.

    out: int32[len(buf)] receives the ids of all spans back to back (a byte makes at
    most one token); out_starts: int64[D+1] gets each span's offset in out. cache is a
    ByteTable mapping pretoken bytes to ids, cleared when full. Runs without the GIL.
    """
    work = np.empty(CACHED_PIECE, np.int32)
    k = 0
    out_starts[0] = 0
    for d in range(starts.size - 1):
        i = starts[d]
        stop = starts[d + 1]
        while i < stop:
            j = piece_end(buf, i, stop, classes)
            n = j - i
            if n == 1:
                out[k] = buf[i]
                k += 1
            elif n > CACHED_PIECE:
                k += _merge_into(buf, i, j, out, k, keys, ranks, first_id)
            else:
                h = fnv1a(buf, i, j)
                e, s = table_find(cache, buf, i, j, h)
                if e >= 0:
                    a = cache.value[e]
                    m = cache.value[e + 1] - a
                    out[k : k + m] = cache.vals[a : a + m]
                else:
                    work[:n] = buf[i:j]
                    m = merge_small(work, n, keys, ranks, first_id)
                    out[k : k + m] = work[:m]
                    _cache_add(cache, buf, i, j, h, s, work, m)
                k += m
            i = j
        out_starts[d + 1] = k


@njit(cache=True)
def _cache_add(cache, buf, i, j, h, s, ids, m):
    """Remember that pretoken buf[i:j] (hash h, free slot s) encodes to ids[:m]; when the
    cache is full, clear it first."""
    if not table_room(cache, j - i, m):
        table_clear(cache)
        _, s = table_find(cache, buf, i, j, h)
    e = table_add(cache, buf, i, j, h, s)
    v = cache.used[2]
    cache.vals[v : v + m] = ids[:m]
    cache.value[e + 1] = v + m
    cache.used[2] = v + m


@njit(cache=True)
def _merge_into(buf, i, j, out, k, keys, ranks, first_id):
    """Merge the long pretoken buf[i:j] directly in out[k:], which has room for j - i ids."""
    n = j - i
    ids = out[k : k + n]
    for t in range(n):
        ids[t] = buf[i + t]
    return merge_large(ids, n, keys, ranks, first_id)
