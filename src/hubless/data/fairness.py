"""Data for fairness audits: the SISPI layout, VisoGender metadata, user tables, and a seeded
synthetic generator with planted bias.

Relevance is always exact equality of a column (e.g. the profession): SISPI's own code matches
file names by prefix, so "nurse" would also match "nurse_practitioner"; we do not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hubless._validation import check_positive_int, check_seed
from hubless.errors import InvalidInput, MissingFile
from hubless.inputs import read_records
from hubless.metrics.truth import Truth

__all__ = [
    "FairnessData",
    "make_fairness_data",
    "relevance_by_column",
    "sispi_table",
    "synthetic_embeddings",
    "visogender_audit_data",
    "visogender_table",
]


def relevance_by_column(gallery_rows: list[dict], query_rows: list[dict], column: str) -> Truth:
    """Query i's relevant items: the gallery rows whose ``column`` equals query i's, exactly."""
    for name, rows in (("gallery", gallery_rows), ("query", query_rows)):
        if rows and column not in rows[0]:
            raise InvalidInput(f"{name} metadata has no column {column!r} (columns: {', '.join(rows[0])})")
    by_value: dict[str, list[int]] = {}
    for i, row in enumerate(gallery_rows):
        by_value.setdefault(str(row[column]), []).append(i)
    lists = []
    for q, row in enumerate(query_rows):
        items = by_value.get(str(row[column]))
        if not items:
            raise InvalidInput(f"query {q} ({column}={row[column]!r}) has no relevant gallery item")
        lists.append(items)
    return Truth.from_lists(lists, len(gallery_rows))


def sispi_table(folder: str | os.PathLike) -> tuple[list[dict], list[dict]]:
    """SISPI layout: images named ``{profession}_{id}_{gender}_{ethnicity}.jpg`` (profession may
    contain underscores). Returns (gallery rows, query rows: one "A photo of a {profession}" each)."""
    folder = Path(folder)
    rows: list[dict] = []
    for f in sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in {".jpg", ".jpeg", ".png"}):
        parts = f.stem.rsplit("_", 3)
        if len(parts) != 4 or not parts[1].isdigit():
            raise InvalidInput(f"{f.name} does not follow {{profession}}_{{id}}_{{gender}}_{{ethnicity}}")
        rows.append({"path": str(f), "profession": parts[0], "id": int(parts[1]), "gender": parts[2], "ethnicity": parts[3]})
    if not rows:
        raise MissingFile(f"no SISPI images in {folder}")
    professions = sorted({r["profession"] for r in rows})
    queries = [{"profession": p, "text": f"A photo of a {p.replace('_', ' ')}"} for p in professions]
    return rows, queries


def visogender_table(root: str | os.PathLike | None = None) -> tuple[list[dict], list[dict]]:
    """VisoGender (Hall et al. 2023) metadata: every image (occupation-participant and
    occupation-object) with its occupation and perceived gender, and one gender-neutral query per
    occupation ("the {occupation} and their {participant}"). Images are URLs only."""
    from hubless.data.karpathy import data_dir

    folder = Path(root) if root is not None else data_dir() / "visogender"
    files = {"OP": folder / "OP_Visogender_11012024.tsv", "OO": folder / "OO_Visogender_10052025.tsv"}
    missing = [f.name for f in files.values() if not f.is_file()]
    if missing:
        raise MissingFile(
            f"VisoGender metadata ({', '.join(missing)}) not found in {folder}: run `hubless data fetch visogender` "
            "(writes ./data/visogender; set HUBLESS_DATA_DIR=data) or set HUBLESS_DATA_DIR to a folder holding visogender/"
        )
    rows: list[dict] = []
    for kind, file in files.items():
        for r in read_records(file):
            other = r.get("Participant") if kind == "OP" else r.get("Object")
            rows.append(
                {
                    "id": r["IDX"],
                    "occupation": r["Occupation"].strip(),
                    "gender": r["Occupation_perceived_gender"].strip(),
                    "other": (other or "").strip(),
                    "kind": kind,
                    "url": r.get("URL type (Type NA if can't find)", ""),
                }
            )
    seen: dict[str, str] = {}
    for r in rows:
        if r["kind"] == "OP":
            seen.setdefault(r["occupation"], r["other"])
    queries = [{"occupation": o, "text": f"the {o} and their {p}"} for o, p in sorted(seen.items())]
    return rows, queries


@dataclass
class FairnessData:
    gallery: np.ndarray
    gallery_rows: list[dict]
    queries: np.ndarray
    query_rows: list[dict]
    query_bank: np.ndarray


def _check_options(*, bias: float, dim: int, n_query_bank: int, noise: float, hub_strength: float, seed: int) -> tuple[int, int, int]:
    """The options of :func:`synthetic_embeddings`, checked: (dim, n_query_bank, seed)."""
    dim, n_query_bank = check_positive_int(dim, "dim"), check_positive_int(n_query_bank, "n_query_bank")
    if not all(np.isfinite(v) for v in (bias, noise, hub_strength)):
        raise InvalidInput(f"bias, noise and hub_strength must be finite; got {bias}, {noise}, {hub_strength}")
    return dim, n_query_bank, check_seed(seed)


def visogender_audit_data(
    *, bias: float = 0.5, dim: int = 64, seed: int = 0, root: str | os.PathLike | None = None
) -> tuple[list[dict], list[dict], np.ndarray, np.ndarray, np.ndarray]:
    """The VisoGender metadata (:func:`visogender_table`) with seeded synthetic embeddings whose
    neutral queries lean ``bias`` towards "masculine" (:func:`synthetic_embeddings`): (gallery
    rows, query rows, gallery, queries, query bank), what ``hubless data visogender`` writes. The
    options are checked before the metadata is read, so a wrong one is named even where the
    VisoGender files are missing."""
    _check_options(bias=bias, dim=dim, n_query_bank=2000, noise=0.6, hub_strength=0.6, seed=seed)
    rows, queries = visogender_table(root)
    gallery, q, bank = synthetic_embeddings(rows, queries, "occupation", {"gender": "masculine"}, bias=bias, dim=dim, seed=seed)
    return rows, queries, gallery, q, bank


def synthetic_embeddings(
    gallery_rows: list[dict],
    query_rows: list[dict],
    match: str,
    attributes: dict[str, str],
    *,
    bias: float = 0.5,
    dim: int = 64,
    n_query_bank: int = 2000,
    noise: float = 0.6,
    hub_strength: float = 0.6,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded embeddings for metadata tables, with planted bias: each gallery item is
    unit(topic of its ``match`` value + 0.6 x a direction per attribute value + noise), a
    random fifth of the items is pulled along the favoured directions (hubs), and each query is
    unit(topic + ``bias`` x the favoured directions + small noise). ``attributes`` maps an
    attribute column to its favoured value (e.g. {"gender": "masculine"}). Returns
    (gallery, queries, query_bank); the bank holds queries of the same form for unseen topics."""
    dim, n_query_bank, seed = _check_options(
        bias=bias, dim=dim, n_query_bank=n_query_bank, noise=noise, hub_strength=hub_strength, seed=seed
    )
    rng = np.random.default_rng(seed)

    def unit(x):
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    topics = sorted({str(r[match]) for r in gallery_rows} | {str(r[match]) for r in query_rows})
    topic_vec = dict(zip(topics, unit(rng.standard_normal((len(topics), dim)))))
    extra_topics = unit(rng.standard_normal((50, dim)))
    directions = {}
    favoured = np.zeros(dim)
    for column, value in attributes.items():
        values = sorted({str(r[column]) for r in gallery_rows})
        if str(value) not in values:
            raise InvalidInput(f"favoured value {value!r} is not a value of {column!r} ({', '.join(values)})")
        directions[column] = dict(zip(values, unit(rng.standard_normal((len(values), dim)))))
        favoured += directions[column][str(value)]
    base = np.array([topic_vec[str(r[match])] + sum(0.6 * directions[c][str(r[c])] for c in attributes) for r in gallery_rows])
    pull = hub_strength * rng.lognormal(0, 0.5, (len(gallery_rows), 1)) * favoured / max(len(attributes), 1)
    gallery = unit(base + noise * unit(rng.standard_normal(base.shape)) + pull * (rng.random((len(gallery_rows), 1)) < 0.2))
    lean = bias * favoured

    def neutral(vectors):
        return unit(vectors + lean + 0.3 * noise * unit(rng.standard_normal(vectors.shape)))

    queries = neutral(np.array([topic_vec[str(r[match])] for r in query_rows]))
    bank = neutral(extra_topics[rng.integers(0, 50, n_query_bank)])
    return gallery, queries, bank


def make_fairness_data(
    n_professions: int = 20,
    per_cell: int = 4,
    genders: tuple[str, ...] = ("feminine", "masculine"),
    ethnicities: tuple[str, ...] = ("asian", "black", "indian", "white"),
    bias: float = 0.5,
    dim: int = 64,
    n_query_bank: int = 2000,
    noise: float = 0.6,
    hub_strength: float = 0.6,
    seed: int = 0,
) -> FairnessData:
    """A SISPI-like synthetic audit: ``per_cell`` images per (profession, gender, ethnicity) and
    one neutral query per profession leaning towards the last gender and the last ethnicity by
    ``bias`` (0: no planted bias); see :func:`synthetic_embeddings`."""
    rows = [
        {"profession": f"profession{p:03d}", "id": i, "gender": g, "ethnicity": e}
        for p in range(n_professions)
        for g in genders
        for e in ethnicities
        for i in range(per_cell)
    ]
    query_rows = [{"profession": f"profession{p:03d}", "text": f"A photo of a profession{p:03d}"} for p in range(n_professions)]
    gallery, queries, bank = synthetic_embeddings(
        rows,
        query_rows,
        "profession",
        {"gender": genders[-1], "ethnicity": ethnicities[-1]},
        bias=bias,
        dim=dim,
        n_query_bank=n_query_bank,
        noise=noise,
        hub_strength=hub_strength,
        seed=seed,
    )
    return FairnessData(gallery, rows, queries, query_rows, bank)
