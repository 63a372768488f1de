"""The pieces of the C++ standard library that decide llama.cpp's draws, as libstdc++ (GCC 12) computes them.

- `MT19937`: std::mt19937 seeded as `std::mt19937(seed)` (init_genrand), drawing 32-bit words with
  Python's own Mersenne Twister (the same generator, in C: only its state is set here).
- `uniform_double`/`uniform_float`: std::uniform_real_distribution<double|float>(0, 1), i.e.
  std::generate_canonical: two 32-bit words for a double ((w0 + w1 * 2^32) / 2^64, summed in
  double), one for a float, and 1.0 replaced by the largest value below it.
- `discrete`: std::discrete_distribution<int> over float weights (sums and cumulative sums in
  double, the last one set to 1, lower_bound of one uniform double), as Mirostat draws.
- `sort` and `partial_sort`: std::sort (introsort: median of three, Hoare partition, a heap sort past
  2*log2(n) levels, a final insertion sort) and std::partial_sort (heap select, then sort_heap), step
  for step, because neither is stable: where keys are equal, only the same steps give the same order.
  Items are (key, value) pairs compared by key with `<` (llama.cpp's "logit greater" comparator is
  key = -logit). The partition steps run vectorised (numpy), the heap steps in Python.
"""

from __future__ import annotations

import random

import numpy as np

THRESHOLD = 16   # libstdc++'s _S_threshold: ranges this short are left to the final insertion sort


# -- random numbers ----------------------------------------------------------------------------------
class MT19937:
    """std::mt19937 seeded with a 32-bit `seed`; `next()` is one call of the engine (uint32)."""

    def __init__(self, seed: int):
        self.seed(seed)

    def seed(self, seed: int) -> None:
        state = [seed & 0xFFFFFFFF]
        for i in range(1, 624):
            prev = state[-1]
            state.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF)
        self._r = random.Random()
        self._r.setstate((3, (*state, 624), None))   # index 624: the first call regenerates, as libstdc++
        bits = self._r.getrandbits
        self.next = lambda: bits(32)

    def state(self):
        return self._r.getstate()


_TWO32 = 4294967296.0
_TWO64 = 18446744073709551616.0
_BELOW_ONE = float(np.nextafter(1.0, 0.0))
_BELOW_ONE_F = np.nextafter(np.float32(1.0), np.float32(0.0))


def uniform_double(rng: MT19937) -> float:
    """std::uniform_real_distribution<double>(0, 1)(rng)."""
    w0 = rng.next()
    w1 = rng.next()
    r = (float(w0) + float(w1) * _TWO32) / _TWO64
    return _BELOW_ONE if r >= 1.0 else r


def uniform_float(rng: MT19937) -> np.float32:
    """std::uniform_real_distribution<float>(0, 1)(rng): one word, rounded to float, over 2^32."""
    r = np.float32(rng.next()) / np.float32(_TWO32)
    return _BELOW_ONE_F if r >= np.float32(1.0) else r


def discrete(weights: np.ndarray, rng: MT19937) -> int:
    """std::discrete_distribution<int>(weights)(rng): fewer than two weights draw nothing."""
    w = np.asarray(weights, np.float32).astype(np.float64).tolist()
    if len(w) < 2:
        return 0
    total = 0.0
    for x in w:
        total += x
    cum, acc = [], 0.0
    for x in w:
        acc += x / total
        cum.append(acc)
    cum[-1] = 1.0
    u = uniform_double(rng)
    lo, hi = 0, len(cum)            # lower_bound: the first cumulative value not less than u
    while lo < hi:
        mid = (lo + hi) // 2
        if cum[mid] < u:
            lo = mid + 1
        else:
            hi = mid
    return lo


# -- heaps (bits/stl_heap.h) -------------------------------------------------------------------------
def _adjust_heap(a: list, first: int, hole: int, length: int, value) -> None:
    top = hole
    second = hole
    while second < (length - 1) // 2:
        second = 2 * (second + 1)
        if a[first + second][0] < a[first + second - 1][0]:
            second -= 1
        a[first + hole] = a[first + second]
        hole = second
    if (length & 1) == 0 and second == (length - 2) // 2:
        second = 2 * (second + 1)
        a[first + hole] = a[first + second - 1]
        hole = second - 1
    key = value[0]
    while hole > top:                 # __push_heap
        parent = (hole - 1) // 2
        if not a[first + parent][0] < key:
            break
        a[first + hole] = a[first + parent]
        hole = parent
    a[first + hole] = value


def _make_heap(a: list, first: int, last: int) -> None:
    length = last - first
    if length < 2:
        return
    parent = (length - 2) // 2
    while True:
        _adjust_heap(a, first, parent, length, a[first + parent])
        if parent == 0:
            return
        parent -= 1


def _pop_heap(a: list, first: int, last: int, result: int) -> None:
    value = a[result]
    a[result] = a[first]
    _adjust_heap(a, first, 0, last - first, value)


def _sort_heap(a: list, first: int, last: int) -> None:
    while last - first > 1:
        last -= 1
        _pop_heap(a, first, last, last)


def partial_sort(keys: np.ndarray, values: np.ndarray, middle: int) -> tuple[np.ndarray, np.ndarray]:
    """std::partial_sort(first, first + middle, last) on (key, value) items by key: the first
    `middle` items afterwards, in order (keys and values as arrays). The heap select runs in
    Python over the items that can enter the heap (found with numpy, a block at a time)."""
    keys = np.asarray(keys, np.float64)
    n = len(keys)
    middle = min(middle, n)
    if middle <= 0:
        return keys[:0], np.asarray(values)[:0]
    vals = np.asarray(values)
    heap = list(zip(keys[:middle].tolist(), vals[:middle].tolist()))
    _make_heap(heap, 0, middle)
    at, block = middle, 256
    while at < n:
        end = min(n, at + block)
        seg = keys[at:end]
        for j in np.flatnonzero(seg < heap[0][0]).tolist():
            k = float(seg[j])
            if k < heap[0][0]:        # the test of __heap_select, against the heap as it is now
                # __pop_heap(first, middle, i): the top goes to i (past middle: dropped), item i sifts in
                _adjust_heap(heap, 0, 0, middle, (k, vals[at + j].item()))
        at, block = end, min(block * 2, 1 << 16)
    _sort_heap(heap, 0, middle)
    return np.array([h[0] for h in heap], np.float64), np.array([h[1] for h in heap], vals.dtype)


# -- introsort (bits/stl_algo.h) ---------------------------------------------------------------------
def sort(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """std::sort on (key, value) items by key, equal keys left where libstdc++'s introsort leaves
    them. The final insertion sort is stable, so the result is a stable sort of the order the
    introsort loop leaves; a range whose keys are all distinct needs no more partitioning (its
    order after the final sort depends on its keys alone)."""
    k = np.array(keys, np.float64)
    v = np.array(values)
    n = len(k)
    if n > 1:
        stack = [(0, n, 2 * (n.bit_length() - 1))]
        while stack:
            first, last, depth = stack.pop()
            while last - first > THRESHOLD:
                seg = k[first:last]
                if len(np.unique(seg)) == len(seg):
                    break
                if depth == 0:
                    _heap_sort_range(k, v, first, last)
                    break
                depth -= 1
                cut = _partition_pivot(k, v, first, last)
                stack.append((cut, last, depth))
                last = cut
    order = np.argsort(k, kind="stable")
    return k[order], v[order]


def _heap_sort_range(k: np.ndarray, v: np.ndarray, first: int, last: int) -> None:
    items = list(zip(k[first:last].tolist(), v[first:last].tolist()))
    _make_heap(items, 0, len(items))
    _sort_heap(items, 0, len(items))
    k[first:last] = [i[0] for i in items]
    v[first:last] = [i[1] for i in items]


def _swap(k: np.ndarray, v: np.ndarray, i: int, j: int) -> None:
    k[i], k[j] = k[j], k[i]
    v[i], v[j] = v[j], v[i]


def _partition_pivot(k: np.ndarray, v: np.ndarray, first: int, last: int) -> int:
    """__unguarded_partition_pivot: the median of (first+1, mid, last-1) moved to first, then Hoare's
    partition of [first+1, last) around it. The scans are computed at once: the i-th item the left
    scan stops at (not less than the pivot) swaps with the i-th the right scan stops at (not greater)
    while they have not crossed; the cut is where the next left scan stops."""
    mid = first + (last - first) // 2
    a, b, c = first + 1, mid, last - 1
    ka, kb, kc = k[a], k[b], k[c]
    if ka < kb:
        m = b if kb < kc else (c if ka < kc else a)
    elif ka < kc:
        m = a
    else:
        m = c if kb < kc else b
    _swap(k, v, first, m)
    pivot = k[first]
    seg = k[first + 1:last]
    lefts = np.flatnonzero(~(seg < pivot)) + (first + 1)
    rights = (np.flatnonzero(~(pivot < seg)) + (first + 1))[::-1]
    n = min(len(lefts), len(rights))
    swaps = int(np.count_nonzero(lefts[:n] < rights[:n]))
    if swaps:
        li, ri = lefts[:swaps], rights[:swaps]
        k[li], k[ri] = k[ri], k[li].copy()
        v[li], v[ri] = v[ri], v[li].copy()
    if swaps == 0:
        return int(lefts[0])
    nxt = int(rights[swaps - 1])
    return min(int(lefts[swaps]), nxt) if swaps < len(lefts) else nxt
