"""``hubless serve``: the HTTP API over saved indexes (FastAPI + uvicorn). The reference is
``docs/service.md``."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand

from hubless.cli._common import friendly_errors
from hubless.errors import InvalidInput


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def transport_warnings(host: str, *, keys: bool, tls: bool, proxies: Sequence[str] = ()) -> list[str]:
    """What ``hubless serve`` warns about how keys travel: a key sent in clear beyond loopback."""
    if keys and not tls and not _is_loopback(host):
        via = (
            f" unless the trusted proxy ({', '.join(proxies)}) terminates TLS and reaches this server over a private network"
            if proxies
            else ""
        )
        return [
            f"API keys sent to {host} without TLS travel in clear{via}: pass --tls-cert and --tls-key, "
            "or serve on 127.0.0.1 behind a reverse proxy that terminates TLS (docs/service.md)"
        ]
    return []


class SettingsCommand(TyperCommand):
    """``hubless serve``: its options are the fields of :class:`hubless.service.settings.ServeSettings`
    (flag, type, default and help from each field), built when first read (help, parsing), so
    ``hubless --help`` imports no pydantic. Only the options given are passed to the settings:
    the others come from ``HUBLESS_SERVE_*`` variables or the fields' defaults."""

    _paths: dict[str, tuple[str, ...]] | None = None

    @property
    def params(self) -> list[Any]:
        if self._paths is None:
            self._paths = {}
            try:
                options, self._paths = settings_options()
            except ImportError:  # no pydantic-settings: the command says which extra to install
                options = []
            self._params.extend(options)
        return self._params

    @params.setter
    def params(self, value: list[Any]) -> None:
        self._params = value

    def invoke(self, ctx: Any) -> Any:
        given: dict[str, Any] = {}
        for name, path in (self._paths or {}).items():
            value = ctx.params.pop(name, None)
            source = ctx.get_parameter_source(name)
            if source is not None and source.name != "DEFAULT":  # typer's click or click's own enum
                *parents, leaf = path
                place = given
                for parent in parents:
                    place = place.setdefault(parent, {})
                place[leaf] = value
        ctx.meta["hubless.serve"] = given
        return super().invoke(ctx)


def settings_options() -> tuple[list[Any], dict[str, tuple[str, ...]]]:
    """The click options of ServeSettings' fields (a nested model's fields are options too:
    ``--max-batch`` sets ``limits.max_batch``) and each option's path in the settings."""
    import inspect

    from pydantic import BaseModel

    from hubless.service.settings import Option, ServeSettings

    parameters, annotations, paths = [], {}, {}

    def walk(model: type[BaseModel], path: tuple[str, ...]) -> None:
        for name, field in model.model_fields.items():
            option = next((m for m in field.metadata if isinstance(m, Option)), Option())
            kind = field.annotation
            if option.flag is None:
                continue
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                walk(kind, (*path, name))
                continue
            repeated = str(kind).startswith("tuple[")
            default = None if repeated or field.default is None else field.default
            flag = option.flag or "--" + name.replace("_", "-")
            info = typer.Option(default, flag, help=field.description, show_default=default not in (None, False))
            parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info))
            annotations[name] = list[str] if repeated else kind
            paths[name] = (*path, name)

    walk(ServeSettings, ())

    def options(**values: Any) -> None:  # pragma: no cover - only its signature is read
        pass

    options.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    options.__annotations__ = annotations
    probe = typer.Typer(add_completion=False)
    probe.command()(options)
    return list(typer.main.get_command(probe).params), paths


@friendly_errors
def serve_command(
    ctx: typer.Context,
    indexes: list[str] = typer.Argument(
        ...,
        help="Index directories to serve, as PATH (named after the folder) or NAME=PATH; an attached collection's sidecar directory (hubless attach --out) serves that collection, read only; a store URI written by hubless export (lancedb://, postgresql://, qdrant://, ...; as NAME=URI or named after its table) serves that store, read only.",
    ),
) -> None:
    """Serve saved indexes over HTTP: POST /search (embeddings, texts or images with the index's
    model, or an item id; compare=true for the uncorrected ranking), GET /indexes, /items,
    /hubness, /health, /metrics; the page at /, API docs at /docs. Every option is also read
    from HUBLESS_SERVE_<OPTION> when not given (a limit: HUBLESS_SERVE_LIMITS__MAX_BATCH)."""
    from hubless.errors import check_available

    check_available("fastapi", "hubless serve", "serve")
    check_available("uvicorn", "hubless serve", "serve")
    check_available("pydantic_settings", "hubless serve", "serve", "pydantic-settings")
    from hubless.cli._common import print_note
    from hubless.service.settings import DEFAULT_HOSTS, ServeSettings

    settings = ServeSettings(**ctx.meta.get("hubless.serve", {}))  # every value checked here, keys read (and again per worker)
    host, proxies = settings.host, settings.trusted_proxies
    if settings.learning.learn_bank and settings.workers > 1:
        raise InvalidInput("--learn-bank commits new versions of the index: serve it with --workers 1")
    if not _is_loopback(host) and settings.api_key_file is None:
        raise InvalidInput(f"binding to {host} exposes the indexes beyond this machine: pass --api-key-file (or bind to 127.0.0.1)")
    for warning in transport_warnings(host, keys=settings.api_key_file is not None, tls=settings.tls_cert is not None, proxies=proxies):
        print_note(warning, "warning")
    named: dict[str, str | Path] = {}
    for value in indexes:
        name, source = _named(value)
        if name in named:
            raise InvalidInput(f"two indexes are named {name!r}: give them names as NAME=PATH")
        named[name] = source
    if host in ("0.0.0.0", "::") and settings.allowed_hosts == DEFAULT_HOSTS:
        print_note(
            f"bound to {host} without --allowed-host: only requests for localhost names are answered (400 otherwise); "
            "pass --allowed-host with the names clients use"
        )
    import json
    import os
    import shutil
    import tempfile

    import uvicorn

    config = {
        **json.loads(settings.model_dump_json()),
        "indexes": {k: v if isinstance(v, str) else str(v.resolve()) for k, v in named.items()},
    }
    os.environ["HUBLESS_SERVE_CONFIG"] = json.dumps(config)  # read by each worker process (file names, never keys)
    options: dict[str, Any] = dict(
        host=host,
        port=settings.port,
        log_level="warning",
        http="hubless.service.protocol:ServeProtocol",
        server_header=False,
        timeout_keep_alive=5,
    )
    # forwarded headers (client address, scheme) only from the proxies named; uvicorn's own default trusts 127.0.0.1
    options.update(proxy_headers=bool(proxies), forwarded_allow_ips=list(proxies))
    if settings.tls_cert is not None:
        options.update(ssl_certfile=str(settings.tls_cert), ssl_keyfile=str(settings.tls_key))
    scheme = "https" if settings.tls_cert is not None else "http"
    workers = settings.workers
    typer.echo(f"serving {', '.join(named)} on {scheme}://{host}:{settings.port} with {workers} worker(s) (API docs: /docs)")
    if workers == 1:
        from hubless.service.app import app_from_environment

        uvicorn.run(app_from_environment(), **options)
        return
    metrics_dir = tempfile.mkdtemp(prefix="hubless-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir  # /metrics sums the workers' counters
    try:
        uvicorn.run("hubless.service.app:app_from_environment", factory=True, workers=workers, **options)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _named(value: str) -> tuple[str, str | Path]:
    """``NAME=PATH`` or ``PATH`` (named after its folder) -> (name, Path); a store URI
    (``lancedb://...``, ``postgresql://user:pass@host/db/table?sslmode=require``), given as it is
    or as ``NAME=URI``, stays the string it is (named after its table)."""
    from hubless.export.base import is_store_uri, parse_uri

    if is_store_uri(value):
        return parse_uri(value).table, value
    name, sep, path = value.partition("=")
    if sep and is_store_uri(path):
        return name, path
    return (name, Path(path)) if sep else (Path(value).name, Path(value))
