"""Fairness audit of corrections: utility (NDCG, AP) and bias (NDKL per attribute and joint,
gender bias@n), per query and overall, for the baseline and each correction.

    result = audit(gallery, queries, relevant, {"gender": genders, "ethnicity": ethnicities},
                   query_bank, methods=["baseline", "nnn"])

``relevant`` says which gallery items answer each query (e.g. SISPI: the images of the queried
profession). Every method is fitted from one streamed pass per bank (:func:`hubless.fit_many`);
for each method the queries are ranked over the whole gallery in streamed blocks
(the ranking form its ``search`` uses); the relevant items, in rank order, give the attribute
sequence whose NDKL is measured (SISPI protocol); NDCG and AP use their ranks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence, Sized
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from hubless._validation import as_embeddings, check_positive_int
from hubless.corrections import Correction, MethodName, fit_many
from hubless.errors import InvalidInput, InvalidType, NotFound
from hubless.evaluation.core import Ranked, prepare_methods, rank_queries
from hubless.evaluation.results import JSONValue
from hubless.fairness.measures import average_precision, gender_bias_at_n, joint_codes, ndcg, ndkl
from hubless.metrics.truth import Truth, TruthLike, load_truth

__all__ = ["FairnessResult", "FairnessAudit", "audit", "encode_attribute"]

MASCULINE = {"masculine", "male", "man", "men", "m"}
FEMININE = {"feminine", "female", "woman", "women", "f"}


def encode_attribute(values: Sequence[object]) -> tuple[npt.NDArray[np.int64], list[str]]:
    """Category labels -> (codes, sorted distinct labels)."""
    labels, codes = np.unique(np.asarray([str(v) for v in values]), return_inverse=True)
    return codes.astype(np.int64), labels.tolist()


@dataclass(frozen=True, slots=True, eq=False)
class FairnessResult:
    """One method's audit: ``metrics`` (means over queries: ``NDCG``, ``AP``, ``NDKL_<attribute>``,
    ``NDKL_joint``, ``precision@n``, ``bias@n``), ``delta`` (the change against the baseline;
    empty for the baseline) and ``per_query``, the values behind each metric (in the JSON too)."""

    method: str
    spec: str
    metrics: dict[str, float]
    delta: dict[str, float] = field(default_factory=dict)
    per_query: dict[str, npt.NDArray[np.float64]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, JSONValue]:
        return {
            "method": self.method,
            "spec": self.spec,
            "metrics": self.metrics,
            "delta_vs_baseline": self.delta,
            "per_query": {k: v.tolist() for k, v in self.per_query.items()},
        }


@dataclass(frozen=True, slots=True, eq=False)
class FairnessAudit:
    """What :func:`audit` returns: ``results`` (baseline first; ``audit["nnn"]`` finds one by spec
    or method name), the labels of every ``attributes`` (``"joint"``: their intersections), the
    ``query_names`` and the ``top_n`` of precision@n and bias@n."""

    results: list[FairnessResult]
    attributes: dict[str, list[str]]
    query_names: list[str]
    top_n: int

    def to_dict(self) -> dict[str, JSONValue]:
        return {
            "attributes": self.attributes,
            "queries": self.query_names,
            "top_n": self.top_n,
            "results": [r.to_dict() for r in self.results],
        }

    def __getitem__(self, spec: str) -> FairnessResult:
        for r in self.results:
            if spec in (r.spec, r.method):
                return r
        raise NotFound(spec)

    def extremes(self, metric: str, spec: str = "baseline", n: int = 5) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        """The ``n`` most and least biased queries by a per-query ``metric`` of one method."""
        values = self[spec].per_query[metric]
        order = np.argsort(-values, kind="stable")
        most = [(self.query_names[i], float(values[i])) for i in order[:n]]
        least = [(self.query_names[i], float(values[i])) for i in order[::-1][:n]]
        return most, least


def audit(
    gallery: npt.ArrayLike,
    queries: npt.ArrayLike,
    relevant: TruthLike,
    attributes: Mapping[str, Sequence[object]],
    query_bank: npt.ArrayLike | None = None,
    methods: Sequence[MethodName | str | Correction] = ("baseline", "nnn"),
    *,
    gallery_bank: npt.ArrayLike | None = None,
    joint: bool = True,
    top_n: int = 10,
    query_names: Sequence[str] | None = None,
    normalize: bool = True,
    progress: bool | None = None,
) -> FairnessAudit:
    """Audit each method (baseline always first). ``attributes`` maps an attribute name to one
    label per gallery item; with ``joint`` and two or more attributes their intersection is
    also measured (``NDKL_joint``). Metrics (means over queries; per-query values kept):
    ``NDCG``, ``AP``, ``NDKL_<attribute>``, ``NDKL_joint``, ``precision@n`` and, for an
    attribute named ``gender`` with masculine/feminine labels, ``bias@n``. ``relevant`` takes
    every form of ground truth :func:`hubless.evaluate` takes (a Truth, ids, lists of ids, a
    file; see :func:`hubless.metrics.load_truth`)."""
    gallery = as_embeddings(gallery, "gallery", normalize=normalize)
    queries = as_embeddings(queries, "queries", normalize=normalize, dim=gallery.shape[1], dim_of="the gallery")
    relevant = load_truth(relevant, queries.shape[0], gallery.shape[0])
    top_n = min(check_positive_int(top_n, "top_n"), gallery.shape[0])
    encoded: dict[str, tuple[np.ndarray, list[str]]] = {}
    if not isinstance(attributes, Mapping):
        raise InvalidType(f"attributes must be a dict of attribute name -> one value per gallery item; got a {type(attributes).__name__}")
    for name, values in attributes.items():
        if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sized):
            raise InvalidType(f"attribute {name!r} must be a list of one value per gallery item; got a {type(values).__name__}")
        if len(values) != gallery.shape[0]:
            raise InvalidInput(f"attribute {name!r} has {len(values)} values for {gallery.shape[0]} gallery items")
        encoded[name] = encode_attribute(values)
    if not encoded:
        raise InvalidInput("give at least one attribute (e.g. gender)")
    if joint and len(encoded) >= 2:
        codes, _ = joint_codes(*(c for c, _ in encoded.values()), sizes=[len(lab) for _, lab in encoded.values()])
        labels = [" & ".join(parts) for parts in _product([lab for _, lab in encoded.values()])]
        encoded["joint"] = (codes, labels)
    if query_names is not None and len(query_names) != queries.shape[0]:
        raise InvalidInput(f"query_names has {len(query_names)} names for {queries.shape[0]} queries")
    names = list(query_names) if query_names is not None else [str(i) for i in range(queries.shape[0])]
    corrections = fit_many(prepare_methods(methods, normalize), gallery, query_bank, gallery_bank, progress=progress)  # one pass per bank
    ranked = rank_queries(corrections, queries, relevant, depth=top_n, progress=progress, desc=f"audit {len(corrections)} methods")
    results = [_audit_one(c, r, relevant, encoded, top_n) for c, r in zip(corrections, ranked)]
    base = results[0]
    results[1:] = [dataclasses.replace(r, delta={k: v - base.metrics[k] for k, v in r.metrics.items()}) for r in results[1:]]
    return FairnessAudit(results, {k: lab for k, (_, lab) in encoded.items()}, names, top_n)


def _product(lists: list[list[str]]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for values in lists:
        out = [o + [v] for o in out for v in values]
    return out


def _audit_one(
    corr: Correction, ranked: Ranked, relevant: Truth, encoded: Mapping[str, tuple[npt.NDArray[np.int64], list[str]]], top_n: int
) -> FairnessResult:
    ranks, top = ranked.ranks, ranked.top
    counts = relevant.counts
    per_query: dict[str, np.ndarray] = {"NDCG": ndcg(ranks, relevant.indptr), "AP": average_precision(ranks, relevant.indptr)}
    # Relevant items of each query in rank order, padded into a (n_queries, max R) matrix.
    order = np.lexsort((ranks, relevant.rows))
    items = relevant.indices[order]
    depth = int(counts.max())
    pos = np.arange(items.size) - np.repeat(relevant.indptr[:-1], counts)
    for name, (codes, labels) in encoded.items():
        seq = np.zeros((relevant.n_queries, depth), dtype=np.int64)
        seq[relevant.rows, pos] = codes[items]
        per_query[f"NDKL_{name}"] = ndkl(seq, len(labels), lengths=counts)
    is_relevant = (
        np.zeros((relevant.n_queries, relevant.n_gallery), dtype=bool) if relevant.n_queries * relevant.n_gallery <= 1 << 26 else None
    )
    if is_relevant is not None:
        is_relevant[relevant.rows, relevant.indices] = True
        per_query[f"precision@{top_n}"] = is_relevant[np.arange(relevant.n_queries)[:, None], top].mean(axis=1)
    if "gender" in encoded:
        codes, labels = encoded["gender"]
        masc = [i for i, v in enumerate(labels) if v.lower() in MASCULINE]
        fem = [i for i, v in enumerate(labels) if v.lower() in FEMININE]
        if len(masc) == 1 and len(fem) == 1:
            per_query[f"bias@{top_n}"] = gender_bias_at_n(codes[top], masc[0], fem[0], top_n)
    metrics = {k: float(v.mean()) for k, v in per_query.items()}
    return FairnessResult(corr.name, corr.spec, metrics, per_query=per_query)
