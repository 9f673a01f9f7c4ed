"""Nesting of intervals and of begin/end records, in numpy: no Python loop
per event, so that millions of events nest in a fraction of a second."""

from __future__ import annotations

import numpy as np

from traces import fastjson


def enclosing(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Parent row of each interval: the latest-starting interval of the same
    group that encloses it (starts no later, ends no earlier); -1 when none.
    An interval that overlaps another without nesting is not its child, and
    one of no length at another's end is inside it.

    Sorted by (group, start, longest first), a sweep gives each row the
    number of rows open where it starts (its depth when all nest), and the
    parent is the last earlier row one level up. Rows where that one does
    not enclose them (overlaps) follow the chain of parents up to the first
    that does."""
    n = len(start)
    parent = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return parent
    # (group, start) as one key where they fit in an int64: a sort a key less
    packed = _side_by_side(group, start)
    order = _by_key_longest_first(packed[0], end) if packed else np.lexsort((-end, start, group))
    g, s, e = group[order], start[order], end[order]
    stacked = fastjson.stack_parents(g, s, e)  # the rule below in one pass, where built
    if stacked is not None:
        parent[order] = np.where(stacked >= 0, order[np.maximum(stacked, 0)], -1)
        return parent
    first = np.r_[True, g[1:] != g[:-1]]
    code = np.cumsum(first) - 1
    before = np.maximum.accumulate(np.where(first, np.arange(n), 0))  # rows of earlier groups
    level = np.arange(n) - before - _closed(code, s, e, before)
    candidate = _one_level_up(level)
    c = np.maximum(candidate, 0)
    candidate[(candidate >= 0) & (code[c] != code)] = -1
    c = np.maximum(candidate, 0)
    # Where all nest, the candidate encloses each row and the rows open at
    # its start are exactly its ancestors; elsewhere (overlaps) the group is
    # nested again row by row.
    wrong = (candidate >= 0) & (e[c] < e) | (depths(candidate) != level)
    for bad in np.unique(code[wrong]):
        rows = np.flatnonzero(code == bad)
        found = _stack_parents(s[rows], e[rows])
        candidate[rows] = np.where(found >= 0, rows[0] + found, -1)
    parent[order] = np.where(candidate >= 0, order[np.maximum(candidate, 0)], -1)
    return parent


def _by_key_longest_first(key: np.ndarray, end: np.ndarray) -> np.ndarray:
    """np.lexsort((-end, key)): rows by key, the longest first where keys
    tie. A stable sort of the key alone, then the tied rows sorted again:
    a trace's rows come in runs already in order (a thread's, a stream's),
    which a stable sort merges, where a lexsort sorts by the end first
    (0.4x the time on a Kineto file of 328 k rows, few ties)."""
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    tied = np.flatnonzero(sorted_key[1:] == sorted_key[:-1])
    if tied.size:
        at = np.union1d(tied, tied + 1)
        rows = order[at]
        order[at] = rows[np.lexsort((-end[rows], key[rows]))]
    return order


def _side_by_side(group: np.ndarray, *times: np.ndarray) -> list | None:
    """Each group's times on a line of its own, the lines side by side
    (group x span + time - low): one int64 key per times array, ordered by
    group then time; None where they do not fit in an int64."""
    low = min(int(t.min()) for t in times)
    span = max(int(t.max()) for t in times) - low + 1
    if int(group.min()) < 0 or span * (int(group.max()) + 1) >= 2**62:
        return None
    line = group.astype(np.int64) * span
    return [line + (t - low) for t in times]


def _stack_parents(s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Parents within one sorted group, one row at a time (overlapping rows)."""
    out = np.full(len(s), -1, dtype=np.int64)
    stack: list[int] = []
    for i in range(len(s)):
        while stack and (e[stack[-1]] < s[i] or e[stack[-1]] == s[i] < e[i] or e[stack[-1]] < e[i]):
            stack.pop()
        if stack:
            out[i] = stack[-1]
        stack.append(i)
    return out


def _closed(code, s, e, before) -> np.ndarray:
    """Per row (sorted), the earlier rows of its group closed where it
    starts: ended before, or at its start unless it has no length."""
    keys = _side_by_side(code, s, e)
    if keys:
        skey, ekey = keys
    else:
        times, inverse = np.unique(np.concatenate([s, e]), return_inverse=True)
        span = len(times) + 1
        skey, ekey = code * span + inverse[: len(s)], code * span + inverse[len(s) :]
    ends = np.sort(ekey)
    below = np.searchsorted(ends, skey, "left") - before
    at = np.searchsorted(ends, skey, "right") - before - below
    zero = np.sort(skey[s == e])
    at -= np.searchsorted(zero, skey, "right") - np.searchsorted(zero, skey, "left")
    return below + np.where(e > s, at, 0)


def _one_level_up(level: np.ndarray) -> np.ndarray:
    """For each row, the last earlier row whose level is one lower; -1 if none."""
    out = np.full(len(level), -1, dtype=np.int64)
    rows = np.arange(len(level))
    for d in range(1, int(level.max(initial=0)) + 1):
        upper = rows[level == d - 1]
        mine = rows[level == d]
        if upper.size == 0:
            continue
        at = np.searchsorted(upper, mine) - 1
        out[mine] = np.where(at >= 0, upper[np.maximum(at, 0)], -1)
    return out


def depths(parent: np.ndarray) -> np.ndarray:
    """Number of ancestors of each row (list ranking by pointer jumping)."""
    walked = fastjson.depths(parent)  # one C pass, where built
    if walked is not None:
        return walked
    depth = (parent >= 0).astype(np.int64)
    up = parent.copy()
    active = np.flatnonzero(up >= 0)
    while active.size:
        above = up[active]
        depth[active] += depth[above]
        up[active] = up[above]
        active = active[up[active] >= 0]
    return depth


def outermost(parent: np.ndarray, marked: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For each of the marked ``rows``, the outermost marked row among itself
    and its ancestors: a walk up from those rows alone, one level a pass (a
    few passes: nesting is shallow), so the cost follows the marked rows,
    not the table."""
    walked = fastjson.outermost(parent, marked, rows)  # one C pass, where built
    if walked is not None:
        return walked
    top = rows.copy()
    at = parent[rows]
    active = np.flatnonzero(at >= 0)
    while active.size:
        here = at[active]
        hit = marked[here]
        top[active[hit]] = here[hit]
        at[active] = parent[here]
        active = active[at[active] >= 0]
    return top


def pair_begin_end(key: np.ndarray, is_begin: np.ndarray):
    """Match begin and end records in file order per key (a stack per key).

    Returns (begin_index, end_index, depth) of each matched pair, in the
    order of the begins, and the counts of ends without a begin and of
    begins never ended."""
    paired = fastjson.pair_edges(key, is_begin)  # the rule below in one pass, where built
    if paired is not None:
        return paired
    begins, ends, depth, unmatched, unclosed = _paired(key, is_begin)
    order = np.argsort(begins)
    return begins[order], ends[order], depth[order], unmatched, unclosed


def _paired(key: np.ndarray, is_begin: np.ndarray):
    """pair_begin_end() in numpy, its pairs in no particular order."""
    order = np.argsort(key, kind="stable")
    k, b = key[order], is_begin[order]
    step = np.where(b, 1, -1)
    first = np.r_[True, k[1:] != k[:-1]]
    level = np.cumsum(step)
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(k)), 0))
    level -= (level - step)[group_start]  # stack height after each record, per key
    # An end that would take the stack below zero has no begin: drop it and
    # pair the rest again (rare: only damaged files take this path).
    group_min = np.minimum.reduceat(level, np.flatnonzero(first)) if len(k) else level
    if (group_min < 0).any():
        keep = np.ones(len(key), dtype=bool)
        keep[order[_unmatched_ends(k, b)]] = False
        kept = np.flatnonzero(keep)
        begins, ends, depth, _, unclosed = _paired(key[kept], is_begin[kept])
        return kept[begins], kept[ends], depth, len(key) - kept.size, unclosed
    # Within a key and a stack height, records alternate begin, end.
    height = np.where(b, level, level + 1)
    o2 = np.lexsort((np.arange(len(k)), height, k))
    kb, hb, bb = k[o2], height[o2], b[o2]
    same_next = np.r_[(kb[1:] == kb[:-1]) & (hb[1:] == hb[:-1]), False]
    pair = bb & same_next & np.r_[~bb[1:], False]
    begins, ends = order[o2[pair]], order[o2[np.flatnonzero(pair) + 1]]
    unclosed = int(b.sum()) - len(begins)
    return begins, ends, hb[pair] - 1, 0, unclosed


def _unmatched_ends(k: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Positions (in key order) of ends with no open begin on their key."""
    out, height, current = [], 0, None
    for i in range(len(k)):
        if k[i] != current:
            current, height = k[i], 0
        if b[i]:
            height += 1
        elif height == 0:
            out.append(i)
        else:
            height -= 1
    return np.asarray(out, dtype=np.int64)
