"""The service's settings, declared once: :class:`Settings` (one application: limits on a request,
each named in the error when exceeded, the API keys, the network-facing security settings) and
:class:`ServeSettings` (``hubless serve``: those plus the server process: address, workers, TLS,
models). Each setting is one pydantic field with its help text; ``hubless serve`` builds its
options from these fields (``--max-batch`` is ``Settings.limits.max_batch``), reads unset ones
from ``HUBLESS_SERVE_*`` environment variables (pydantic-settings: ``HUBLESS_SERVE_RATE_LIMIT=50``,
``HUBLESS_SERVE_LIMITS__MAX_BATCH=64``, lists as JSON), and hands the same object to each
worker process. In Python::

    create_app({"coco": "idx/"}, settings=Settings(keys=Keys.from_files("write.key"), image_root="images/"))

A bad value is an :class:`hubless.errors.InvalidInput` naming the setting. Keys are read from
files into the application's state, never put in the environment (a worker process of
``hubless serve --workers N`` reads the files itself).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from hubless.errors import InvalidInput, optional_import

try:
    from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
    from pydantic_settings import BaseSettings, SettingsConfigDict
except ImportError:  # pragma: no cover - the serve extra is missing: say which one
    optional_import("pydantic_settings", "the HTTP service's settings", "serve", "pydantic-settings")  # raises, naming the extra
    raise

__all__ = [
    "DEFAULT_HOSTS",
    "DEFAULT_RATE_BURST",
    "DEFAULT_RATE_LIMIT",
    "BankLearning",
    "ENV_PREFIX",
    "Keys",
    "Limits",
    "Option",
    "ServeSettings",
    "Settings",
]

#: Host names a loopback server answers to by default (besides the address it binds).
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")
#: Requests per second one client address may make on average, and at once (``hubless serve
#: --rate-limit / --rate-burst``): generous for a person or a page, a brake on a key-guessing loop.
DEFAULT_RATE_LIMIT = 100.0
DEFAULT_RATE_BURST = 200
#: Shortest key accepted (e.g. ``openssl rand -hex 32`` gives 64 characters).
MIN_KEY_LENGTH = 16
#: Environment variables read for the settings not given: ``HUBLESS_SERVE_<FIELD>`` (a limit:
#: ``HUBLESS_SERVE_LIMITS__<FIELD>``). Not ``HUBLESS_``: ``HUBLESS_LOCK_TIMEOUT`` is the library's.
ENV_PREFIX = "HUBLESS_SERVE_"


@dataclass(frozen=True)
class Option:
    """How a setting shows on ``hubless serve``'s command line: ``flag`` (default ``--field-name``;
    a repeatable option's is singular, e.g. ``--allowed-host``), or ``flag=None``: not an option."""

    flag: str | None = ""


def _invalid(exc: ValidationError) -> InvalidInput:
    """One :class:`InvalidInput` naming each bad setting (a check's own message kept as it is)."""
    problems = []
    for error in exc.errors(include_url=False):
        if error["type"] == "value_error" and "error" in error.get("ctx", {}):
            problems.append(str(error["ctx"]["error"]))
            continue
        name = str(error["loc"][-1]) if error["loc"] else "settings"
        message = error["msg"][:1].lower() + error["msg"][1:]
        problems.append(f"{name}: {message}; got {error['input']!r}")
    return InvalidInput("; ".join(problems))


def _not_a_bool(value: Any, name: str | None) -> Any:
    if isinstance(value, bool):  # pydantic would take True for 1
        raise ValueError(f"{name} must be a number; got {value!r}")
    return value


class _Checked:
    """A pydantic model whose bad values are an :class:`InvalidInput` (a ValueError), not a
    ``ValidationError``."""

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise _invalid(exc) from None


class Limits(_Checked, BaseModel):
    """Caps on a request, each reported by name when exceeded: ``max_body_bytes`` (413, counted
    while the body is read, chunked bodies too), ``max_batch`` queries or rows, ``max_top_k``,
    ``max_text_chars`` per text query, and ``max_result_hits`` = queries x top_k x (1 +
    compare), the size of an answer (422)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_body_bytes: int = Field(default=8 * 2**20, ge=1, description="Largest request body (chunked bodies too).")
    max_batch: int = Field(default=256, ge=1, description="Most queries (or rows) per request.")
    max_top_k: int = Field(default=1000, ge=1, description="Largest top_k.")
    max_text_chars: int = Field(default=1000, ge=1, description="Longest text query, in characters.")
    max_result_hits: int = Field(default=50_000, ge=1, description="Largest answer: queries x top_k x (2 with compare).")

    @field_validator("*", mode="before")
    @classmethod
    def _integers(cls, value: Any, info: Any) -> Any:
        return _not_a_bool(value, info.field_name)


class BankLearning(_Checked, BaseModel):
    """``--learn-bank NAME``: learn that index's query bank from the queries it answers
    (:class:`hubless.learning.BankLearner`; see docs/how-to/learn-the-bank.md). The client a
    query counts against for the quota is its address (the connection's, or the one a trusted
    proxy forwards): API keys are shared by every reader, so they cannot tell clients apart."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    learn_bank: Annotated[tuple[str, ...], Option("--learn-bank")] = Field(
        default=(), description="Index whose query bank is learned from the queries it answers (repeatable; default: none)."
    )
    learn_bank_capacity: int = Field(default=50_000, ge=1, description="Queries the learned bank holds at most.")
    learn_bank_window: float = Field(
        default=7 * 86400.0, gt=0, allow_inf_nan=False, description="Seconds a query is kept at most (in memory; default 7 days)."
    )
    learn_bank_quota: float = Field(default=0.05, gt=0, le=1, description="Share of the bank one client address may hold (1: no quota).")
    learn_bank_fold: float = Field(default=0.98, gt=0, le=1, description="Cosine at which a query folds into one kept (counts once).")
    learn_bank_every: int = Field(default=5_000, ge=1, description="Refit after this many new bank queries ...")
    learn_bank_interval: float = Field(default=3600.0, gt=0, allow_inf_nan=False, description="... or after this many seconds with some.")
    learn_bank_holdout: float = Field(default=0.1, ge=0.01, lt=1, description="Share of the queries held out to judge each refit on.")
    learn_bank_seed: Path | None = Field(
        default=None, description="Embeddings file of a bank to start from (a share of it is never displaced; default: none)."
    )
    learn_bank_seed_share: float = Field(default=0.1, ge=0, le=0.5, description="Share of the bank the seed keeps at least.")
    learn_bank_max_bias_shift: float = Field(
        default=0.05, ge=0, allow_inf_nan=False, description="A refit moving an item's score by more than this relative to the others ..."
    )
    learn_bank_max_bias_outlier: float = Field(
        default=8.0, ge=0, allow_inf_nan=False, description="... and by more than this many robust deviations of the moves is rejected."
    )
    learn_bank_max_skewness_increase: float = Field(
        default=0.05, ge=0, allow_inf_nan=False, description="A refit raising the held-out queries' N10 skewness by more is rejected."
    )

    @field_validator("*", mode="before")
    @classmethod
    def _numbers(cls, value: Any, info: Any) -> Any:
        return value if info.field_name in ("learn_bank", "learn_bank_seed") else _not_a_bool(value, info.field_name)

    @field_validator("learn_bank_seed")
    @classmethod
    def _seed(cls, path: Path | None) -> Path | None:
        if path is not None and not path.is_file():
            raise ValueError(f"--learn-bank-seed {path} is not a file")
        return None if path is None else path.absolute()


@dataclass(frozen=True, repr=False)
class Keys:
    """API keys, like Qdrant's: ``write`` may do everything, ``read`` (optional) only reads.
    With a key set, every request but the page, its assets, the docs and ``/health`` carries
    ``Authorization: Bearer <key>`` (401 otherwise; a read key on a write is 403)."""

    write: str | None = None
    read: str | None = None

    def __post_init__(self) -> None:
        if self.read is not None and self.write is None:
            raise InvalidInput("a read-only key needs a write key too (--api-key-file): without one nobody could write")
        for name, key in (("write", self.write), ("read", self.read)):
            if key is not None and (len(key) < MIN_KEY_LENGTH or any(c.isspace() for c in key)):
                raise InvalidInput(
                    f"the {name} key must be at least {MIN_KEY_LENGTH} characters without spaces (e.g. `openssl rand -hex 32`)"
                )
        if self.read is not None and self.read == self.write:
            raise InvalidInput("the read-only key and the write key must differ")

    @property
    def required(self) -> bool:
        return self.write is not None

    @classmethod
    def from_files(cls, write: str | os.PathLike[str] | None = None, read: str | os.PathLike[str] | None = None) -> Keys:
        """Keys read from files (one key each, surrounding whitespace dropped)."""
        return cls(_read_key(write, "--api-key-file"), _read_key(read, "--read-key-file"))

    def __repr__(self) -> str:  # never print a key
        return f"Keys(write={'set' if self.write else None}, read={'set' if self.read else None})"


def _read_key(path: str | os.PathLike[str] | None, flag: str) -> str | None:
    if path is None:
        return None
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read the key file given as {flag}: {exc}") from None
    if len(key) < MIN_KEY_LENGTH:
        raise InvalidInput(
            f"{flag} {path} holds a key of {len(key)} characters; use at least {MIN_KEY_LENGTH} (e.g. `openssl rand -hex 32`)"
        )
    return key


class Settings(_Checked, BaseSettings):
    """Everything about one application but its indexes and models; each field's description
    is its ``hubless serve`` help. Unset fields are read from ``HUBLESS_SERVE_<FIELD>``.

    ``keys``: the API keys (:class:`Keys`), or read from ``api_key_file`` / ``read_key_file``.
    ``image_root`` is resolved; a metadata ``path`` must stay inside it. ``allowed_hosts``:
    ``("*",)`` answers any Host (e.g. behind a proxy that checks it). ``header_timeout`` /
    ``body_timeout`` apply under ``hubless serve``'s protocol (:mod:`hubless.service.protocol`).
    ``writes``: False turns writes off (several worker processes each hold their own copy).
    Beyond ``rate_limit`` / ``rate_burst`` a client gets a 429 with Retry-After (``/health`` is
    never limited); the address is the connection's, or the one a trusted proxy forwards."""

    model_config = SettingsConfigDict(
        frozen=True, extra="forbid", arbitrary_types_allowed=True, env_prefix=ENV_PREFIX, env_nested_delimiter="__"
    )

    api_key_file: Path | None = Field(
        default=None,
        description="File holding the write key (Authorization: Bearer KEY); then every request needs a key. Required beyond loopback.",
    )
    read_key_file: Path | None = Field(default=None, description="File holding a read-only key (searches and reads, no writes).")
    keys: Annotated[Keys, Option(None)] = Field(default_factory=lambda: Keys(), exclude=True, description="The API keys (never printed).")
    image_root: Path | None = Field(
        default=None, description="Folder item images are served from (metadata 'path' relative to it); none: no images."
    )
    allowed_hosts: Annotated[tuple[str, ...], Option("--allowed-host")] = Field(
        default=DEFAULT_HOSTS,
        description="Host header value to answer (repeatable; default: localhost names and the bind address; * for any).",
    )
    cors_origins: Annotated[tuple[str, ...], Option("--cors-origin")] = Field(
        default=(), description="Browser origin allowed to call the API (repeatable; default: none)."
    )
    audit_log: Path | None = Field(default=None, description="Append one JSON line per write here (time, key, endpoint, ids).")
    lock_timeout: float = Field(
        default=5.0, gt=0, lt=3600, description="Seconds a write waits for the index's lock before answering 503 (Retry-After)."
    )
    header_timeout: float = Field(default=10.0, gt=0, lt=3600, description="Seconds a client has to send a request's headers.")
    body_timeout: float = Field(default=30.0, gt=0, lt=3600, description="Seconds a client has to send a request's body.")
    limits: Limits = Field(default_factory=lambda: Limits(), description="Caps on a request.")
    learning: BankLearning = Field(default_factory=lambda: BankLearning(), description="Query banks learned from the traffic.")
    writes: Annotated[bool, Option(None)] = Field(default=True, description="Whether writes are accepted (with a write key).")
    rate_limit: float = Field(
        default=DEFAULT_RATE_LIMIT,
        ge=0,
        lt=1e6,
        allow_inf_nan=False,
        description="Requests per second per client address, on average (0: no limit).",
    )
    rate_burst: int = Field(
        default=DEFAULT_RATE_BURST, ge=1, description="Requests one client address may make at once before the rate limit applies."
    )

    @model_validator(mode="before")
    @classmethod
    def _read_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "keys" not in data and (data.get("api_key_file") or data.get("read_key_file")):
            data = {**data, "keys": Keys.from_files(data.get("api_key_file"), data.get("read_key_file"))}
        return data

    @field_validator("lock_timeout", "header_timeout", "body_timeout", "rate_limit", "rate_burst", mode="before")
    @classmethod
    def _numbers(cls, value: Any, info: Any) -> Any:
        return _not_a_bool(value, info.field_name)

    @field_validator("image_root")
    @classmethod
    def _image_root(cls, root: Path | None) -> Path | None:
        if root is not None and not root.is_dir():
            raise ValueError(f"the image root {root} is not a folder")
        return None if root is None else root.resolve()

    @field_validator("api_key_file", "read_key_file", "audit_log")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        return None if path is None else path.absolute()  # the same file for every worker process


def _bind_hosts(host: str) -> tuple[str, ...]:
    return (*DEFAULT_HOSTS, *([] if host in ("0.0.0.0", "::") else [host]))


class ServeSettings(Settings):
    """``hubless serve``'s settings: the application's (:class:`Settings`) and the server
    process's: the address, the worker processes, TLS, the proxies trusted, the query and
    rerank models. ``allowed_hosts`` defaults to the localhost names and the bound address, and
    ``writes`` to ``workers == 1``."""

    model: str | None = Field(
        default=None,
        description="Model (name or folder) that encodes text/image queries (default: the model each index records; must be the same model).",
    )
    allow_model_mismatch: bool = Field(default=False, description="Encode queries with --model even where an index records another model.")
    host: str = Field(default="127.0.0.1", description="Address to bind (loopback by default).")
    port: int = Field(default=8000, ge=0, lt=65536, description="Port.")
    workers: int = Field(default=1, ge=1, description="Server processes, each with its own copy of the indexes (writes need 1).")
    rerank: str | None = Field(
        default=None, description="Cross-encoder (BLIP ITM or sentence-transformers name/folder) text searches may rerank with."
    )
    rerank_k: int = Field(default=20, ge=1, description="Candidates per query given to the reranker.")
    tls_cert: Path | None = Field(default=None, description="TLS certificate (PEM) to serve HTTPS with (with --tls-key).")
    tls_key: Path | None = Field(default=None, description="The TLS certificate's private key (PEM).")
    trusted_proxies: Annotated[tuple[str, ...], Option("--trusted-proxy")] = Field(
        default=(),
        description="Address of a reverse proxy whose X-Forwarded-For/-Proto headers are trusted (repeatable; default: none are).",
    )

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            if "allowed_hosts" not in data:
                data["allowed_hosts"] = _bind_hosts(str(data.get("host", "127.0.0.1")))
            if "writes" not in data:
                data["writes"] = str(data.get("workers", 1)).strip() == "1"
        return data

    @field_validator("tls_cert", "tls_key")
    @classmethod
    def _pem(cls, path: Path | None, info: Any) -> Path | None:
        if path is not None and not path.is_file():
            raise ValueError(f"--{info.field_name.replace('_', '-')} {path} is not a file")
        return None if path is None else path.absolute()

    @model_validator(mode="after")
    def _tls_pair(self) -> ServeSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("give --tls-cert and --tls-key together (the certificate and its private key)")
        return self
