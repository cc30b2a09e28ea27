"""The service's settings, one frozen object per application: limits on a request (each named
in the error when exceeded), the API keys, and the network-facing security settings.

``hubless serve`` fills them from its options; in Python::

    create_app({"coco": "idx/"}, settings=Settings(keys=Keys.from_files("write.key"), image_root="images/"))

Keys are read from files into the application's state, never put in the environment (a
worker process of ``hubless serve --workers N`` reads the files itself).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from hubless.errors import InvalidInput

__all__ = ["DEFAULT_HOSTS", "DEFAULT_RATE_BURST", "DEFAULT_RATE_LIMIT", "Keys", "Limits", "Settings"]

#: Host names a loopback server answers to by default (besides the address it binds).
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")
#: Requests per second one client address may make on average, and at once (``hubless serve
#: --rate-limit / --rate-burst``): generous for a person or a page, a brake on a key-guessing loop.
DEFAULT_RATE_LIMIT = 100.0
DEFAULT_RATE_BURST = 200
#: Shortest key accepted (e.g. ``openssl rand -hex 32`` gives 64 characters).
MIN_KEY_LENGTH = 16


@dataclass(frozen=True)
class Limits:
    """Caps on a request, each reported by name when exceeded: ``max_body_bytes`` (413, counted
    while the body is read, chunked bodies too), ``max_batch`` queries or rows, ``max_top_k``,
    ``max_text_chars`` per text query, and ``max_result_hits`` = queries x top_k x (1 +
    compare), the size of an answer (422)."""

    max_body_bytes: int = 8 * 2**20
    max_batch: int = 256
    max_top_k: int = 1000
    max_text_chars: int = 1000
    max_result_hits: int = 50_000

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_batch", "max_top_k", "max_text_chars", "max_result_hits"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidInput(f"{name} must be a positive integer; got {value!r}")


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
    def from_files(cls, write: str | os.PathLike | None = None, read: str | os.PathLike | None = None) -> Keys:
        """Keys read from files (one key each, surrounding whitespace dropped)."""
        return cls(_read_key(write, "--api-key-file"), _read_key(read, "--read-key-file"))

    def __repr__(self) -> str:  # never print a key
        return f"Keys(write={'set' if self.write else None}, read={'set' if self.read else None})"


def _read_key(path, flag: str) -> str | None:
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


@dataclass(frozen=True)
class Settings:
    """Everything about one application but its indexes and models.

    ``image_root``: the folder item images are served from (``GET /items/{name}/{id}/image``;
    None: no image endpoint); a metadata ``path`` is resolved inside it and must stay inside it.
    ``allowed_hosts``: Host header values answered (default :data:`DEFAULT_HOSTS`; ``("*",)``
    answers any, e.g. behind a proxy that checks it). ``cors_origins``: origins allowed to call
    from a browser (none by default: CORS off). ``audit_log``: a file each write appends one
    JSON line to (time, key, endpoint, ids). ``lock_timeout``: seconds a write waits for the
    index's lock before a 503 with Retry-After. ``header_timeout`` / ``body_timeout``: seconds a
    client has to send a request's headers / its body before the connection is closed (``hubless
    serve``'s protocol; see :mod:`hubless.service.protocol`). ``writes``: False turns writes off
    (several worker processes each hold their own copy). ``rate_limit``: requests per second
    each client address may make on average (:data:`DEFAULT_RATE_LIMIT`; 0 turns the limit off),
    ``rate_burst`` at once (:data:`DEFAULT_RATE_BURST`): beyond them a 429 with Retry-After
    (``/health`` is never limited). The address is the connection's, or the one a trusted proxy
    forwards (``hubless serve --trusted-proxy``)."""

    limits: Limits = field(default_factory=Limits)
    keys: Keys = field(default_factory=Keys)
    image_root: Path | None = None
    allowed_hosts: tuple[str, ...] = DEFAULT_HOSTS
    cors_origins: tuple[str, ...] = ()
    audit_log: Path | None = None
    lock_timeout: float = 5.0
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    writes: bool = True
    rate_limit: float = DEFAULT_RATE_LIMIT
    rate_burst: int = DEFAULT_RATE_BURST

    def __post_init__(self) -> None:
        if not isinstance(self.rate_limit, (int, float)) or isinstance(self.rate_limit, bool) or not 0 <= self.rate_limit < 1e6:
            raise InvalidInput(f"rate_limit must be a number of requests per second in [0, 1e6) (0: no limit); got {self.rate_limit!r}")
        if not isinstance(self.rate_burst, int) or isinstance(self.rate_burst, bool) or self.rate_burst < 1:
            raise InvalidInput(f"rate_burst must be a positive integer; got {self.rate_burst!r}")
        if self.image_root is not None:
            root = Path(self.image_root)
            if not root.is_dir():
                raise InvalidInput(f"the image root {root} is not a folder")
            object.__setattr__(self, "image_root", root.resolve())
        if self.audit_log is not None:
            object.__setattr__(self, "audit_log", Path(self.audit_log))
        object.__setattr__(self, "allowed_hosts", tuple(self.allowed_hosts))
        object.__setattr__(self, "cors_origins", tuple(self.cors_origins))
        for name in ("lock_timeout", "header_timeout", "body_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value < 3600:
                raise InvalidInput(f"{name} must be a number of seconds in (0, 3600); got {value!r}")
