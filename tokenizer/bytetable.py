"""An open-addressing hash table keyed by byte strings, as plain arrays for compiled code.

One layout serves two uses: the pretoken counter of training (value[e] is a count) and
the pretoken cache of encoding (value[e]:value[e+1] is the entry's span in `vals`, its
token ids; entries are appended in order, so value doubles as an offset table).
Compiled functions never reallocate: they report "full" and Python grows or clears.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit


class ByteTable(NamedTuple):
    """Entries E (keys appended in order) behind S hash slots; passed whole to njit code."""

    slots: np.ndarray  # int32[S], S a power of two: entry index, -1 when empty
    hashes: np.ndarray  # uint64[E]: hash of each entry's key
    key_start: np.ndarray  # int64[E+1]: entry e's key is keys[key_start[e]:key_start[e+1]]
    keys: np.ndarray  # uint8[A]: key bytes, appended
    value: np.ndarray  # int64[E+1]: count (counter) or start of token span in vals (cache)
    vals: np.ndarray  # int32[B]: token ids of cached entries (unused by the counter)
    used: np.ndarray  # int64[3]: entries, key bytes, vals in use


def new_table(entries: int, key_bytes: int, vals: int = 1) -> ByteTable:
    """An empty table for `entries` keys totalling `key_bytes` bytes (and `vals` token ids)."""
    slots = 1 << max(4, int(2 * entries - 1).bit_length())  # load factor at most 1/2
    return ByteTable(
        slots=np.full(slots, -1, np.int32),
        hashes=np.zeros(entries, np.uint64),
        key_start=np.zeros(entries + 1, np.int64),
        keys=np.zeros(key_bytes, np.uint8),
        value=np.zeros(entries + 1, np.int64),
        vals=np.zeros(vals, np.int32),
        used=np.zeros(3, np.int64),
    )


def grown(t: ByteTable) -> ByteTable:
    """A copy of a counter table with twice the room for entries and key bytes."""
    n, nk = int(t.used[0]), int(t.used[1])
    g = new_table(2 * t.hashes.size, 2 * t.keys.size)
    g.hashes[:n] = t.hashes[:n]
    g.key_start[: n + 1] = t.key_start[: n + 1]
    g.keys[:nk] = t.keys[:nk]
    g.value[: n + 1] = t.value[: n + 1]
    g.used[:] = t.used
    _reslot(g.slots, g.hashes, n)
    return g


@njit(cache=True)
def _reslot(slots, hashes, n):
    mask = slots.size - 1
    for e in range(n):
        s = np.int64(hashes[e] & np.uint64(mask))
        while slots[s] >= 0:
            s = (s + 1) & mask
        slots[s] = e


@njit(cache=True, inline="always")
def fnv1a(buf, i, j):
    """64-bit FNV-1a hash of buf[i:j], finished with a shift-xor so low bits mix well."""
    h = np.uint64(0xCBF29CE484222325)
    for k in range(i, j):
        h = (h ^ np.uint64(buf[k])) * np.uint64(0x100000001B3)
    return h ^ (h >> np.uint64(29))


@njit(cache=True)
def table_find(t, buf, i, j, h):
    """Entry index of key buf[i:j] with hash h, or -1; also the slot where it would go."""
    mask = t.slots.size - 1
    s = np.int64(h & np.uint64(mask))
    n = j - i
    while True:
        e = t.slots[s]
        if e < 0:
            return -1, s
        if t.hashes[e] == h:
            a = t.key_start[e]
            if t.key_start[e + 1] - a == n:
                same = True
                for k in range(n):
                    if t.keys[a + k] != buf[i + k]:
                        same = False
                        break
                if same:
                    return e, s
        s = (s + 1) & mask


@njit(cache=True)
def table_add(t, buf, i, j, h, s):
    """Append key buf[i:j] (hash h) as a new entry in empty slot s; returns its index.

    The caller checks room first (table_room).
    """
    e = t.used[0]
    a = t.used[1]
    n = j - i
    t.keys[a : a + n] = buf[i:j]
    t.hashes[e] = h
    t.key_start[e + 1] = a + n
    t.slots[s] = e
    t.used[0] = e + 1
    t.used[1] = a + n
    return e


@njit(cache=True, inline="always")
def table_room(t, key_len, n_vals):
    """True when one more entry with key_len bytes and n_vals token ids fits."""
    return (
        t.used[0] + 1 < t.hashes.size
        and t.used[1] + key_len <= t.keys.size
        and t.used[2] + n_vals <= t.vals.size
    )


@njit(cache=True)
def table_clear(t):
    """Forget every entry (the encode cache's eviction: all at once, when full)."""
    t.slots[:] = -1
    t.used[:] = 0
    t.key_start[0] = 0
    t.value[0] = 0
