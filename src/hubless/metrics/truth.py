"""Ground truth: which gallery items are relevant to each query.

One relevant item per query (an int array) and several (lists, or CSR) share one form,
:class:`Truth`. For the "n captions per item" layout of COCO and Flickr30k (caption j describes
image j // n), :func:`captions_per_item` builds both directions.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias, Union

import numpy as np
import numpy.typing as npt

from hubless.errors import InvalidInput, MissingFile

__all__ = ["Truth", "TruthLike", "captions_per_item", "load_truth"]


@dataclass(frozen=True)
class Truth:
    """Relevant gallery ids per query in CSR form: query i's items are
    ``indices[indptr[i]:indptr[i + 1]]`` (sorted, unique, each in ``[0, n_gallery)``)."""

    indptr: np.ndarray
    indices: np.ndarray
    n_gallery: int

    def __post_init__(self) -> None:
        indptr = np.asarray(self.indptr, dtype=np.int64)
        indices = np.asarray(self.indices, dtype=np.int64)
        if indptr.ndim != 1 or indptr.size < 2 or indptr[0] != 0 or indptr[-1] != indices.size:
            raise InvalidInput("truth: indptr must start at 0 and end at len(indices), with at least one query")
        counts = np.diff(indptr)
        if (counts < 1).any():
            first = int(np.flatnonzero(counts < 1)[0])
            raise InvalidInput(f"truth: query {first} has no relevant gallery item; every query needs at least one")
        if indices.size and (indices.min() < 0 or indices.max() >= self.n_gallery):
            raise InvalidInput(f"truth: relevant ids must be in [0, {self.n_gallery}); got {indices.min()}..{indices.max()}")
        rows = np.repeat(np.arange(counts.size), counts)
        order = np.lexsort((indices, rows))
        indices = indices[order]
        if (np.diff(indices)[np.diff(rows) == 0] == 0).any():
            raise InvalidInput("truth: a query lists the same relevant item twice")
        object.__setattr__(self, "indptr", indptr)
        object.__setattr__(self, "indices", indices)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_labels(cls, labels, n_gallery: int) -> Truth:
        """One relevant gallery item per query: ``labels[i]``."""
        labels = np.asarray(labels)
        if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
            raise InvalidInput(f"truth labels must be a 1-D integer array; got {labels.dtype} {labels.shape}")
        return cls(np.arange(labels.size + 1), labels.astype(np.int64), int(n_gallery))

    @classmethod
    def from_array(cls, array, n_gallery: int) -> Truth:
        """From an integer array: 1-D (one gallery id per query) or 2-D (ids padded with -1)."""
        arr = np.asarray(array)
        if not np.issubdtype(arr.dtype, np.integer):
            raise InvalidInput(f"truth must hold integers (gallery ids); got {arr.dtype}")
        if arr.ndim == 1:
            return cls.from_labels(arr, n_gallery)
        if arr.ndim == 2:
            valid = arr >= 0
            counts = valid.sum(axis=1)
            return cls(np.concatenate([[0], np.cumsum(counts)]), arr[valid], n_gallery)
        raise InvalidInput(f"truth must be 1-D (one id per query) or 2-D (ids padded with -1); got shape {arr.shape}")

    @classmethod
    def from_lists(cls, lists, n_gallery: int) -> Truth:
        """Several relevant items per query: ``lists[i]`` is a sequence of gallery ids."""
        counts = np.fromiter((len(x) for x in lists), dtype=np.int64)
        flat = [v for x in lists for v in x]
        wrong = next((v for v in flat if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_))), None)
        if wrong is not None:  # int() would truncate 2.7 to 2 and turn "3" into 3 without a word
            raise InvalidInput(f"truth must hold integers (gallery ids); got {wrong!r} ({type(wrong).__name__})")
        return cls(np.concatenate([[0], np.cumsum(counts)]), _id_array([int(v) for v in flat]), int(n_gallery))

    # ------------------------------------------------------------------ views
    @property
    def n_queries(self) -> int:
        return self.indptr.size - 1

    @property
    def counts(self) -> np.ndarray:
        """Number of relevant items of each query, (n_queries,)."""
        return np.diff(self.indptr)

    @property
    def rows(self) -> np.ndarray:
        """The query of each entry of ``indices``."""
        return np.repeat(np.arange(self.n_queries), self.counts)

    def expected_occurrence(self) -> np.ndarray:
        """How many queries each gallery item is relevant to, (n_gallery,): the N_1 a perfect
        ranking would give when every query has one relevant item."""
        return np.bincount(self.indices, minlength=self.n_gallery)

    def subset(self, queries: np.ndarray) -> Truth:
        """The truth of the queries ``queries`` (indices), in that order."""
        queries = np.asarray(queries, dtype=np.int64)
        starts, stops = self.indptr[queries], self.indptr[queries + 1]
        counts = stops - starts
        offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
        take = np.arange(counts.sum()) + offsets
        return Truth(np.concatenate([[0], np.cumsum(counts)]), self.indices[take], self.n_gallery)

    def to_json(self) -> list[list[int]]:
        return [self.indices[a:b].tolist() for a, b in zip(self.indptr[:-1], self.indptr[1:])]


def captions_per_item(n_items: int, per: int = 5) -> tuple[Truth, Truth]:
    """Both directions for the layout where caption j describes item j // per (COCO, Flickr30k).

    Returns ``(text_to_image, image_to_text)``: the first has one relevant image per caption
    (n_items * per queries over n_items images); the second ``per`` relevant captions per image.
    """
    if n_items < 1 or per < 1:
        raise InvalidInput("captions_per_item needs n_items >= 1 and per >= 1")
    t2i = Truth.from_labels(np.arange(n_items * per) // per, n_items)
    i2t = Truth(np.arange(n_items + 1) * per, np.arange(n_items * per), n_items * per)
    return t2i, i2t


#: Every form of ground truth :func:`load_truth` reads: a :class:`Truth`, ids (an array, a list,
#: lists of ids), a ``.npy`` / ``.json`` file or a layout such as ``"t2i:5"``.
TruthLike: TypeAlias = Union[Truth, npt.ArrayLike, "os.PathLike[str]"]


def load_truth(source, n_queries: int, n_gallery: int) -> Truth:
    """Ground truth in any accepted form, checked to fit ``n_queries`` queries over ``n_gallery``
    items. Every entry point that takes ground truth (evaluation, tuning, the fairness audit,
    the CLI) goes through here, so all accept the same forms.

    ``source`` is a :class:`Truth`; an integer array (1-D: one gallery id per query; 2-D: several
    padded with -1); a list of ids or a list of lists of ids; a ``.npy`` file holding such an
    array; a ``.json`` file holding a list of ids or a list of lists; or a layout shorthand:
    ``"t2i:5"`` (caption j -> image j // 5) or ``"i2t:5"`` (image i -> captions 5i..5i+4).
    """
    if isinstance(source, Truth):
        truth = source
    elif isinstance(source, np.ndarray):
        truth = Truth.from_array(source, n_gallery)
    elif isinstance(source, (list, tuple)):
        if source and all(isinstance(x, (list, tuple, np.ndarray)) for x in source):
            truth = Truth.from_lists(source, n_gallery)
        else:
            truth = Truth.from_array(np.asarray(source), n_gallery)
    else:
        text = str(source)
        kind, _, per = text.partition(":")
        if kind in {"t2i", "i2t"} and per.isdigit() and not Path(text).exists():
            n_items = n_gallery if kind == "t2i" else n_queries
            t2i, i2t = captions_per_item(n_items, int(per))
            truth = t2i if kind == "t2i" else i2t
        else:
            truth = _read_truth_file(Path(text), n_gallery)
    if truth.n_queries != n_queries or truth.n_gallery != n_gallery:
        raise InvalidInput(
            f"truth covers {truth.n_queries} queries x {truth.n_gallery} gallery items, but there are "
            f"{n_queries} queries and {n_gallery} gallery items"
        )
    return truth


def _read_truth_file(path: Path, n_gallery: int) -> Truth:
    if not path.is_file():
        raise MissingFile(f"truth file not found: {path} (or use a layout such as 't2i:5')")
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"truth file {path} is not valid JSON: {exc}") from None
        if not isinstance(data, list) or not data:
            raise InvalidInput(f"truth file {path} must hold a non-empty list (ids, or lists of ids)")
        if all(isinstance(x, int) and not isinstance(x, bool) for x in data):
            return Truth.from_labels(_id_array(data), n_gallery)
        if all(isinstance(x, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in x) for x in data):
            return Truth.from_lists(data, n_gallery)
        raise InvalidInput(f"truth file {path} must hold integers or lists of integers")
    if path.suffix == ".npy":
        from hubless.inputs import load_array

        try:
            return Truth.from_array(load_array(path, mmap=False), n_gallery)
        except ValueError as exc:
            raise InvalidInput(f"truth file {path}: {exc}") from None
    raise InvalidInput(f"truth file {path}: unsupported format {path.suffix!r}; use .npy or .json")


def _id_array(values: list[int]) -> np.ndarray:
    """Gallery ids as int64; a value no gallery could hold (beyond int64) is a clear error."""
    try:
        return np.asarray(values, dtype=np.int64)
    except OverflowError:
        big = next(v for v in values if not -(2**63) <= v < 2**63)
        raise InvalidInput(f"truth holds the id {big}, which is no gallery position (ids are 0 .. n_gallery - 1)") from None
