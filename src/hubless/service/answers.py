"""The answers of the HTTP API (pydantic models, declared as each route's ``response_model``, so
``/docs`` and ``/openapi.json`` show every answer). Each model lists its fields in the order the
route writes them; the routes declare ``response_model_exclude_unset``, so an answer is the
dict the route built, byte for byte (a field a route leaves out stays out, e.g. ``reranked``
unless a search was reranked). The searches answer pre-serialised orjson (their model documents
the answer; nothing is validated on that path, which stays as fast as before). Fields are kept
(``extra="allow"``) rather than dropped should a route add one; tests/service/test_service_answers.py
checks that every answer has exactly its model's fields."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Auth",
    "BankAdded",
    "BankLearned",
    "BankHub",
    "Banks",
    "HubnessAnswer",
    "HubnessFigures",
    "Health",
    "Hit",
    "IndexDescription",
    "IndexListing",
    "IndexSummary",
    "Item",
    "LearnedBank",
    "RefitDecision",
    "ItemsAdded",
    "ItemRemoved",
    "QueryResult",
    "SearchAnswer",
    "ServedHub",
    "ServedHubness",
    "StoreAnn",
    "StoreDescription",
    "Weight",
]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class Auth(_Answer):
    required: bool = Field(description="Whether requests need a key (Authorization: Bearer KEY).")
    read_only_key: bool = Field(description="Whether the server has a read-only key besides the write key.")


class Health(_Answer):
    """``GET /health``: liveness, what is served, whether keys are needed and writes accepted."""

    status: str = Field(description='"ok".')
    indexes: list[str] = Field(description="The names of the served indexes.")
    auth: Auth
    writes: bool = Field(description="Whether writes are accepted (a write key is set and one worker process).")


class Weight(_Answer):
    name: str = Field(description="The correction's query-time weight parameter (NNN alpha, DN lambda).")
    value: float | None = Field(description="Its value in the index.")


class IndexSummary(_Answer):
    """One served index, as every answer about it starts."""

    name: str
    n_items: int = Field(description="Items in the index now.")
    method: str = Field(description="The correction and its parameters (e.g. nnn:alpha=0.75,k=4).")
    factory: str | None = Field(description="The FAISS index factory string.")
    model: str | None = Field(description="The model the gallery was embedded with (a local folder by its last part).")
    weight: Weight | None = Field(description="The query-time weight, when the correction has one.")
    queries: list[str] = Field(description="What the index can be queried with: embeddings, item, texts, images.")
    metadata_columns: list[str]


class IndexListing(IndexSummary):
    """``GET /indexes``: one per served index."""

    images: bool = Field(description="Whether item images are served (an image root and a metadata path column).")


class Banks(_Answer):
    query_bank: int | None = Field(description="Stored query-bank rows (None: not kept).")
    gallery_bank: int | None = Field(description="Stored gallery-bank rows (None: not kept).")


class StoreAnn(_Answer):
    type: str | None = Field(description="The store's ANN index (e.g. IVF_FLAT, HNSW).")
    knob: str | None = Field(description="The search knob it reads: nprobe or ef_search.")
    default: int | None = Field(description="The knob's default (measured at export for a target recall).")


class StoreDescription(_Answer):
    """A served store (``hubless serve NAME=STORE_URI``): what :func:`hubless.export.describe`
    says of it, and its scheme and table only (its URI may hold credentials: never shown)."""

    scheme: str = Field(description="The store's URI scheme (lancedb, postgresql, qdrant, ...).")
    table: str = Field(description="The table or collection.")
    metric: str = Field(description="The stored vectors' metric (dot).")
    bias_columns: int = Field(description="Bias columns appended to each row: [r, bias(r)].")
    metadata_columns: dict[str, str] = Field(description="The payload columns and their types.")
    ann: StoreAnn | None = Field(description="The store's ANN index (None: searched exactly).")


class IndexDescription(IndexSummary):
    """``GET /indexes/{name}``."""

    info: dict[str, Any] = Field(description="Index.info() without what names the server's disk: parameters, sizes, build time.")
    banks: Banks
    format_version: int = Field(description="The on-disk format version (a store's: the format of what hubless export wrote).")
    store: StoreDescription | None = Field(default=None, description="Present for a store written by hubless export.")


class Item(_Answer):
    """``GET /items/{name}/{id}``."""

    id: int
    metadata: dict[str, Any] | None = Field(description="The item's metadata record (None: the index has none).")


class ItemsAdded(IndexSummary):
    """``POST /items/{name}``: the index after the write and the new (or replaced) items' ids."""

    added: list[int]


class ItemRemoved(IndexSummary):
    """``DELETE /items/{name}/{id}``."""

    removed: int


class BankAdded(IndexSummary):
    """``POST /bank/{name}``."""

    bank_queries_added: int


class HubnessFigures(_Answer):
    skewness: float | None = Field(description="Skewness of N_1 over the gallery.")
    kurtosis: float | None
    max: int = Field(description="The largest N_1.")


class BankHub(_Answer):
    id: int
    n1_before: int
    n1_after: int
    metadata: dict[str, Any] | None


class Histogram(_Answer):
    before: list[int] = Field(description="Items with N_1 = 0, 1, 2, ... before the correction.")
    after: list[int]


class ServedHub(_Answer):
    id: int
    n1: int = Field(description="Queries served this item first.")
    nk: int = Field(description="Queries served this item anywhere in their results.")


class ServedHubness(_Answer):
    queries: int = Field(description="Queries served since the server started.")
    n1_skewness: float | None
    top1pct_share: float | None = Field(description="Share of all returned results taken by the most returned 1% of items.")
    n1_max: int
    hubs: list[ServedHub]


class RefitDecision(_Answer):
    """One refit of a learned bank (``hubless.learning.BankLearner``): kept (``accepted``: the
    version it committed) or ``rejected`` (kept as a version never served) and why; or
    ``superseded`` (a write meanwhile) or ``failed``. ``before`` / ``after``: the hubness of the
    held-out queries with the version served before and with the refit."""

    time: str = Field(description="When (UTC, ISO 8601).")
    unix: float
    from_version: int | None = Field(description="The version refitted (None: an index in memory).")
    bank: dict[str, Any] = Field(description="The bank fitted on: size, seed, traffic, clients, ages (seconds).")
    holdout: int = Field(description="Held-out queries judged on.")
    computed_rows: int | None = Field(default=None, description="Bank queries whose similarities were computed (the rest reused).")
    reused_rows: int | None = None
    accepted: bool | None = None
    reasons: list[str] = Field(default_factory=list, description="Why it was rejected (empty when accepted).")
    before: dict[str, Any] | None = Field(default=None, description="N1/N10 skewness, largest hub's share and hubs before.")
    after: dict[str, Any] | None = Field(default=None, description="The same with the refit.")
    bias_shift: float | None = Field(default=None, description="The largest move of an item's score relative to the others.")
    bias_bound: float | None = None
    moved_item: int | None = None
    version: int | None = Field(default=None, description="The version it was committed or kept as (None: an index in memory).")
    decision: str = Field(description="accepted, rejected, superseded or failed.")
    phases: dict[str, float] = Field(default_factory=dict, description="Seconds of each step: statistics, candidate, guard, commit.")
    seconds: float


class LearnedBank(_Answer):
    """``--learn-bank``: the reservoir, the queue, the decisions so far and every refit."""

    reservoir: dict[str, Any] = Field(description="Size, seed, traffic, held out, clients, ages (seconds), window, quota, offered.")
    queued: int
    dropped: int
    every: int
    interval_s: float | None
    guard: dict[str, Any]
    decisions: dict[str, int]
    history: list[RefitDecision]


class HubnessAnswer(_Answer):
    """``GET /hubness/{name}``: N_1 over the stored query bank before and after the correction
    (``note`` instead when the index kept no bank), ``served``: the hubness of the answers, and
    ``learning`` with ``--learn-bank``: the learned bank and its refits over time."""

    index: str
    n_bank_queries: int
    note: str | None = None
    before: HubnessFigures | None = None
    after: HubnessFigures | None = None
    coverage: float | None = Field(default=None, description="Share of the gallery that is some bank query's nearest item.")
    hubs: list[BankHub] | None = None
    histogram: Histogram | None = None
    served: ServedHubness
    learning: LearnedBank | None = None


class Hit(_Answer):
    id: int = Field(description="The item's id.")
    score: float | None = Field(description="The method's score (the reranker's when reranked; None when not finite).")
    metadata: dict[str, Any] | None = Field(default=None, description="The item's metadata (when the index has some).")
    first_stage_score: float | None = Field(default=None, description="With rerank: the corrected score before reranking.")
    uncorrected_rank: int | None = Field(
        default=None, description="With compare: its rank without the correction (None: not in that top k)."
    )
    rank_change: int | None = Field(default=None, description="With compare: uncorrected_rank - rank (positive: moved up).")


class QueryResult(_Answer):
    query: int = Field(description="The query's position in the request.")
    text: str | None = Field(default=None, description="The text query (text and image queries).")
    certified: bool | None = Field(
        default=None,
        description="An attached collection only: whether the answer is certified, exact relative to the store's plain ranking (see docs/attach.md).",
    )
    exact: bool | None = Field(
        default=None,
        description="An attached collection only: whether the answer equals exact corrected search over the collection as it is now (see docs/attach.md).",
    )
    candidates: int | None = Field(
        default=None, description="An attached collection only: the candidates (k') the answer was re-scored from."
    )
    hits: list[Hit]
    uncorrected: list[Hit] | None = Field(default=None, description="With compare: the uncorrected top k.")


class SearchAnswer(_Answer):
    """``POST /search`` and ``POST /search/binary``."""

    index: str
    method: str
    reranked: bool | None = Field(default=None, description="Present (true) when the hits were reranked.")
    rerank_k: int | None = Field(default=None, description="With reranked: the candidates reranked per query.")
    results: list[QueryResult]


class ItemsDeleted(IndexSummary):
    """``POST /items/{name}/delete``."""

    removed: list[int] = Field(description="The ids removed.")


class MetadataUpdated(IndexSummary):
    """``POST /items/{name}/metadata``."""

    updated: list[int] = Field(description="The ids whose metadata changed.")


class BankLearned(IndexSummary):
    """``POST /bank/{name}/refit`` (the decision) and ``POST /bank/{name}/reset`` (the reservoir)."""

    decision: RefitDecision | None = Field(default=None, description="The refit's decision (None: too few queries to try).")
    reservoir: dict[str, Any] | None = None


class VersionRestored(IndexSummary):
    """``POST /versions/{name}/{version}/restore``."""

    restored: int = Field(description="The kept version made current again.")
    version: int = Field(description="The new version it became (a restore is a write).")


class Version(_Answer):
    version: int
    items: int | None = Field(default=None, description="Items in that version.")
    rows: int | None = Field(default=None, description="Rows (items and removed rows not yet compacted away).")
    segments: int | None = Field(default=None, description="Write segments on top of its base.")
    base: str | None = Field(default=None, description="The base it reads.")
    committed: str | None = Field(description="When it was committed (UTC, ISO 8601).")
    current: bool
    damaged: bool | None = Field(default=None, description="Present (true) when its record cannot be read.")


class Versions(_Answer):
    """``GET /versions/{name}``."""

    name: str
    keep_versions: int = Field(description="How many versions the index keeps (0: none besides the current one).")
    versions: list[Version] = Field(description="The readable versions, oldest first.")
