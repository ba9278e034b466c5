"""A bag's waiting jobs without an object per job.

A bag of a million jobs admitted as a deque of a million ints and a dict of a million
parameter strings costs the event loop half a second to build, ~90 MB, and every full
garbage collection walks the deque's million ints (50-100 ms a pass on a small VM,
issue 14). Here a freshly admitted bag is a range of indexes (`JobQueue`) and one
string of all its jobs' parameters with an array of offsets (`PackedParams`): a few
objects whatever the bag's size, none of them a container the collector walks.
"""

from __future__ import annotations

import itertools
import json
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, overload

_PACK_CHUNK = 4096  # points encoded per join while packing (bounds the temporary list)


def _compact_encoder() -> Callable[[Any], str]:
    """json.dumps(p, separators=(",", ":")), the same text, made once: json.dumps makes
    a JSONEncoder per call, and JSONEncoder.encode a C encoder per call; json's C
    encoder itself, made once, takes 1.5 µs for {"i":123} against 3.9 for
    JSONEncoder.encode (a 100,000-job bag's points: 0.15 against 0.39 s)."""
    python_encoder = json.JSONEncoder(separators=(",", ":"))
    # (Not in typeshed; None in an interpreter without json's C accelerator.)
    make_c_encoder = getattr(json.encoder, "c_make_encoder", None)
    if make_c_encoder is None:
        return python_encoder.encode
    markers: dict[int, Any] = {}  # containers being encoded (cycles): empty after each point
    c_encoder = make_c_encoder(
        markers,
        python_encoder.default,  # raises TypeError for what JSON cannot hold
        json.encoder.encode_basestring_ascii,  # ensure_ascii, as json.dumps
        None,  # no indent
        ":",
        ",",
        False,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )

    def encode(point: Any) -> str:
        try:
            return "".join(c_encoder(point, 0))
        except BaseException:
            # An encoding that failed leaves its containers marked: the next point
            # whose containers reuse their ids would be taken for a cycle.
            markers.clear()
            raise

    return encode


_encode_compact = _compact_encoder()
# The C scanner json.loads ends in, without json.loads's two Python-level frames and its
# whitespace matching around the document: 0.5 against 1.9 µs for a job's {"i":123}.
# (An attribute each JSONDecoder sets on itself, which typeshed does not declare.)
_scan_json: Callable[[str, int], tuple[Any, int]] = vars(json.JSONDecoder())["scan_once"]


def decode_params(text: str) -> dict[str, Any]:
    """A job's parameters from their compact JSON (as `PackedParams.encode` wrote them)."""
    try:
        params, end = _scan_json(text, 0)
    except StopIteration:
        end = -1
    if end != len(text) or not isinstance(params, dict):
        raise ValueError(f"not a job's parameters: {text[:80]!r}")
    return params


class JobQueue:
    """Job indexes waiting for a slot, next first, with deque's operations.

    `front` (retries, put first), then the range [next, stop) of jobs never queued
    before (admission), then `back` (appended one by one, as recovery does)."""

    __slots__ = ("_back", "_front", "_next", "_stop")

    def __init__(self, stop: int = 0) -> None:
        self._front: deque[int] = deque()
        self._next = 0
        self._stop = stop
        self._back: deque[int] = deque()

    def __len__(self) -> int:
        return len(self._front) + (self._stop - self._next) + len(self._back)

    def __bool__(self) -> bool:
        # Asked every pass of every bag: without `__len__`'s sum.
        return bool(self._front) or self._next < self._stop or bool(self._back)

    def __iter__(self) -> Iterator[int]:
        return itertools.chain(self._front, range(self._next, self._stop), self._back)

    @property
    def first(self) -> Sequence[int]:
        """The indexes put first (`appendleft`: retries), next first; the rest of the
        queue follows them. Read-only: the deadline policy's inputs read what the
        retries saved without walking the whole queue."""
        return self._front

    def popleft(self) -> int:
        if self._front:
            return self._front.popleft()
        if self._next < self._stop:
            self._next += 1
            return self._next - 1
        if self._back:
            return self._back.popleft()
        raise IndexError("pop from an empty JobQueue")

    def appendleft(self, idx: int) -> None:
        self._front.appendleft(idx)

    def append(self, idx: int) -> None:
        self._back.append(idx)


class PackedParams(Sequence[str]):
    """Each job's parameters (compact JSON), packed: one string and the offset where
    each job's text ends (array of int64: 8 bytes a job, no object per job)."""

    __slots__ = ("_ends", "_text")

    def __init__(self, text: str, ends: array) -> None:
        self._text = text
        self._ends = ends

    @classmethod
    def encode(cls, points: Iterable[dict[str, Any]]) -> PackedParams:
        """Pack the points (CPU-bound: run it off the event loop)."""
        parts: list[str] = []
        ends = array("q")
        at = 0
        it = iter(points)
        while chunk := list(itertools.islice(it, _PACK_CHUNK)):
            texts = [_encode_compact(p) for p in chunk]
            for text in texts:
                at += len(text)
                ends.append(at)
            parts.append("".join(texts))
        return cls("".join(parts), ends)

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, idx: int) -> str: ...
    @overload
    def __getitem__(self, idx: slice) -> Sequence[str]: ...
    def __getitem__(self, idx: int | slice) -> str | Sequence[str]:
        if isinstance(idx, slice):
            return [self[i] for i in range(*idx.indices(len(self)))]
        if idx < 0:
            idx += len(self)
        if not 0 <= idx < len(self._ends):
            raise IndexError(f"job index {idx} out of range")
        start = self._ends[idx - 1] if idx else 0
        return self._text[start : self._ends[idx]]

    def __iter__(self) -> Iterator[str]:
        text, start = self._text, 0
        for end in self._ends:
            yield text[start:end]
            start = end


class FreshParams:
    """The parameters of a bag's jobs that never ran (no JobRun yet), taken once each
    with `pop`, like a dict of index -> compact JSON: the bag's packed parameters as
    admitted (`base`; a bitmap says which were taken), plus single jobs set one by one
    (as recovery loads them)."""

    __slots__ = ("_base", "_more", "_taken")

    def __init__(self, base: Sequence[str] = ()) -> None:
        self._base = base
        self._taken = bytearray(len(base))  # 1 byte a job: which were popped
        self._more: dict[int, str] = {}

    def __setitem__(self, idx: int, params: str) -> None:
        self._more[idx] = params

    def get(self, idx: int) -> str | None:
        """A job's parameters, not taken (None if taken or never there)."""
        if idx in self._more:
            return self._more[idx]
        if 0 <= idx < len(self._taken) and not self._taken[idx]:
            return self._base[idx]
        return None

    def pop(self, idx: int) -> str:
        """A job's parameters, once (KeyError if taken or never there)."""
        if idx in self._more:
            return self._more.pop(idx)
        if 0 <= idx < len(self._taken) and not self._taken[idx]:
            self._taken[idx] = 1
            return self._base[idx]
        raise KeyError(idx)


class HeldJobs:
    """A bag's jobs held for credit, in the order they were held, with the operations of
    the ordered set (a dict of None) it replaces: `idx in`, `del held[idx]`,
    `held[idx] = None`, len and iteration.

    The range [next, stop) held at admission (minus indexes taken out of its middle,
    `_gone`), then indexes held one by one (recovery, a retry held again): a bag of a
    million held jobs is a few objects, as `JobQueue` is for queued ones."""

    __slots__ = ("_gone", "_later", "_next", "_stop")

    def __init__(self, start: int = 0, stop: int = 0) -> None:
        self._next = start
        self._stop = max(start, stop)
        self._gone: set[int] = set()
        self._later: dict[int, None] = {}

    def _in_range(self, idx: int) -> bool:
        return self._next <= idx < self._stop and idx not in self._gone

    def __contains__(self, idx: object) -> bool:
        return isinstance(idx, int) and (self._in_range(idx) or idx in self._later)

    def __delitem__(self, idx: int) -> None:
        if not self._in_range(idx):
            del self._later[idx]  # a KeyError, as a dict's, when it is not held
            return
        if idx != self._next:
            self._gone.add(idx)
            return
        self._next += 1
        while self._next in self._gone:  # the front moves past what left before it
            self._gone.discard(self._next)
            self._next += 1

    def __setitem__(self, idx: int, value: None) -> None:
        if idx not in self:
            self._later[idx] = value

    def __len__(self) -> int:
        return self._stop - self._next - len(self._gone) + len(self._later)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[int]:
        gone = self._gone
        in_range = (i for i in range(self._next, self._stop) if i not in gone)
        return itertools.chain(in_range, self._later)


class HeldQueue:
    """An account's held jobs, oldest first, as (bag_id, idx) with the operations of the
    deque it replaces (`[0]`, popleft, append, appendleft, len, iteration); a run of
    consecutive indexes of one bag is one segment [bag_id, start, stop]."""

    __slots__ = ("_len", "_segments")

    def __init__(self) -> None:
        self._segments: deque[list[Any]] = deque()
        self._len = 0

    def extend_range(self, bag_id: str, start: int, stop: int) -> None:
        """Hold jobs start..stop-1 of a bag, after everything held so far."""
        if start >= stop:
            return
        last = self._segments[-1] if self._segments else None
        if last is not None and last[0] == bag_id and last[2] == start:
            last[2] = stop
        else:
            self._segments.append([bag_id, start, stop])
        self._len += stop - start

    def append(self, item: tuple[str, int]) -> None:
        bag_id, idx = item
        self.extend_range(bag_id, idx, idx + 1)

    def appendleft(self, item: tuple[str, int]) -> None:
        bag_id, idx = item
        first = self._segments[0] if self._segments else None
        if first is not None and first[0] == bag_id and first[1] == idx + 1:
            first[1] = idx
        else:
            self._segments.appendleft([bag_id, idx, idx + 1])
        self._len += 1

    def __getitem__(self, position: int) -> tuple[str, int]:
        if position != 0 or not self._segments:
            raise IndexError("HeldQueue gives its first item only")
        first = self._segments[0]
        return first[0], first[1]

    def popleft(self) -> tuple[str, int]:
        if not self._segments:
            raise IndexError("pop from an empty HeldQueue")
        first = self._segments[0]
        item = (first[0], first[1])
        first[1] += 1
        if first[1] >= first[2]:
            self._segments.popleft()
        self._len -= 1
        return item

    def drop_first_run(self) -> None:
        """Drop the first segment whole (its bag is gone: none of it can run)."""
        first = self._segments.popleft()
        self._len -= first[2] - first[1]

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return ((bag_id, i) for bag_id, start, stop in self._segments for i in range(start, stop))
