"""mkdocs hooks: reference pages generated from the code, so they cannot drift from it.

A page asks for a generated section with an HTML comment on a line of its own:

* ``<!-- generated: cli -->``: every ``hubless`` command, from the typer app (usage, help, options);
* ``<!-- generated: http -->``: every HTTP endpoint, from the service's OpenAPI schema (the full
  schema is also written to ``openapi.json`` beside the site's pages);
* ``<!-- generated: methods -->``: every correction with its spec name, defaults and tuning grid;
* ``<!-- generated: errors -->``: every error kind, the builtins it also is, its CLI exit code and
  HTTP status (from the service's own mapping).

Docstrings keep their Sphinx roles (``:func:`x```), which Markdown shows as ``:func:`` before the
code; the page's HTML drops the role and keeps the code.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

_MARK = re.compile(r"^<!-- generated: (\w+) -->$", re.M)
_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):(<code>)")


def on_page_markdown(markdown: str, page, config, files) -> str:
    return _MARK.sub(lambda m: GENERATORS[m.group(1)](), markdown)


def on_page_content(html: str, page, config, files) -> str:
    return _ROLE.sub(r"\1", html)


def on_files(files, config):
    """Add ``openapi.json`` (the service's schema) to the site, as a file pages can link to."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, "openapi.json", content=json.dumps(openapi_schema(), indent=1) + "\n"))
    return files


# --- the CLI ------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    """One table cell: one line, pipes escaped, typer's escaped brackets (\\[) plain again."""
    return " ".join(str(text).split()).replace("\\[", "[").replace("|", "\\|")


def _type_name(param) -> str:
    if hasattr(param, "display_type"):  # typer's own parameters (typer vendors click)
        try:
            return param.display_type(None).strip("<>")
        except Exception:  # noqa: BLE001 - a type that needs a context: its bare name
            return param.bare_type()
    return param.type.name.lower()


def _option_row(param) -> tuple[str, str, str, str]:
    names = ", ".join(f"`{o}`" for o in [*param.opts, *getattr(param, "secondary_opts", [])])
    if param.param_type_name == "argument":
        names = f"`{param.name.upper()}`"
    kind = "" if getattr(param, "is_flag", False) else _type_name(param)
    if getattr(param, "multiple", False):
        kind += " (repeatable)"
    if param.required:
        default = "required"
    elif getattr(param, "is_flag", False) and param.secondary_opts:
        default = "" if param.default is None else f"`{param.opts[0] if param.default else param.secondary_opts[0]}`"
    elif getattr(param, "is_flag", False):
        default = "off" if not param.default else "on"
    elif param.default in (None, [], ()):
        default = ""
    else:
        default = f"`{param.default if not isinstance(param.default, Path) else str(param.default)}`"
    return names, kind, default, _cell(getattr(param, "help", "") or "")


def _command_markdown(path: list[str], cmd) -> list[str]:
    import typer  # noqa: F401  (the app below needs it)

    name = " ".join(path)
    lines = [f"### `{name}` {{#{name.replace(' ', '-')}}}", ""]
    lines += [inspect.cleandoc(cmd.help or "").replace("\b\n", "").replace("\\[", "["), ""]
    ctx_params = [p for p in cmd.params if p.name != "help"]
    usage_parts = [f"[{p.name.upper()}]" if not p.required else p.name.upper() for p in ctx_params if p.param_type_name == "argument"]
    lines += ["```text", f"{name} {' '.join(usage_parts)} [OPTIONS]".replace("  ", " "), "```", ""]
    if ctx_params:
        lines += ["| option | type | default | what it does |", "|---|---|---|---|"]
        lines += ["| " + " | ".join(_option_row(p)) + " |" for p in ctx_params]
        lines.append("")
    return lines


def cli_reference() -> str:
    import typer

    from hubless.cli.main import app

    root = typer.main.get_command(app)
    lines = [
        "Every command and option, generated from the `hubless` command itself (`hubless COMMAND --help`",
        "prints the same). Global options: `--version`, `--debug` (the traceback of an unexpected error).",
        "",
    ]
    todo = [(["hubless"], root)]
    summary = ["| command | what it does |", "|---|---|"]
    while todo:
        path, cmd = todo.pop(0)
        if hasattr(cmd, "commands"):
            todo = [([*path, n], sub) for n, sub in sorted(cmd.commands.items())] + todo
            continue
        name = " ".join(path)
        first = inspect.cleandoc(cmd.help or "").split("\n\n")[0]
        summary.append(f"| [`{name}`](#{name.replace(' ', '-')}) | {_cell(first)} |")
        lines += _command_markdown(path, cmd)
    return "\n".join([*lines[:3], *summary, "", *lines[3:]])


# --- the HTTP API -------------------------------------------------------------------------------


def openapi_schema() -> dict:
    """The service's OpenAPI schema, from an app serving a small in-memory index."""
    import numpy as np

    from hubless.index import Index
    from hubless.service import create_app

    rng = np.random.default_rng(0)
    gallery = rng.standard_normal((64, 8)).astype(np.float32)
    index = Index.build(gallery, gallery, "nnn:k=4", "Flat")
    return create_app({"example": index}).openapi()


def _type(schema: dict, defs: dict) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[1]
    if "anyOf" in schema:
        kinds = [_type(s, defs) for s in schema["anyOf"] if s.get("type") != "null"]
        return " or ".join(kinds) + (" or null" if any(s.get("type") == "null" for s in schema["anyOf"]) else "")
    if schema.get("type") == "array":
        return f"list of {_type(schema.get('items', {}), defs)}"
    return schema.get("type", "any")


def _fields(schema: dict, defs: dict) -> list[str]:
    rows = ["| field | type | default | description |", "|---|---|---|---|"]
    required = set(schema.get("required", []))
    for name, field in schema.get("properties", {}).items():
        default = "required" if name in required else (f"`{json.dumps(field['default'])}`" if "default" in field else "")
        limits = [f"{k} {field[k]}" for k in ("minimum", "maximum", "maxItems") if k in field]
        desc = _cell(field.get("description", "")) + (f" ({', '.join(limits)})" if limits else "")
        rows.append(f"| `{name}` | {_type(field, defs)} | {default} | {desc} |")
    return rows


def http_reference() -> str:
    schema = openapi_schema()
    defs = schema.get("components", {}).get("schemas", {})
    lines = [
        f"Generated from the service's OpenAPI schema ({schema['info']['title']}, OpenAPI {schema['openapi']}); "
        "a running server shows the same at `/docs`, and the schema itself is [openapi.json](../openapi.json).",
        "",
        "| method | path | what it does |",
        "|---|---|---|",
    ]
    endpoints = [(path, method, op) for path, ops in schema["paths"].items() for method, op in ops.items()]
    for path, method, op in endpoints:
        lines.append(
            f"| `{method.upper()}` | `{path}` | {_cell((op.get('description') or op.get('summary', '')).split(chr(10) + chr(10))[0])} |"
        )
    lines.append("")
    for path, method, op in endpoints:
        lines += [f"### `{method.upper()} {path}`", "", inspect.cleandoc(op.get("description") or op.get("summary", "")), ""]
        params = op.get("parameters", [])
        if params:
            lines += ["| parameter | in | type | description |", "|---|---|---|---|"]
            for p in params:
                lines.append(f"| `{p['name']}` | {p['in']} | {_type(p.get('schema', {}), defs)} | {_cell(p.get('description', ''))} |")
            lines.append("")
        body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        if body:
            name = _type(body, defs)
            target = defs.get(name, body)
            lines += [f"Request body (JSON, `{name}`): {_cell(target.get('description', ''))}", "", *_fields(target, defs), ""]
        answer = op.get("responses", {}).get("200", {}).get("content", {}).get("application/json", {}).get("schema")
        if answer and defs.get(_type(answer, defs).removeprefix("list of "), {}).get("properties"):  # hubless.service.answers
            name = _type(answer, defs)
            target = defs[name.removeprefix("list of ")]
            lines += [f"Answer (JSON, `{name}`): {_cell(target.get('description', ''))}", "", *_fields(target, defs), ""]
        codes = ", ".join(f"{code} {_cell(r.get('description', ''))}" for code, r in op.get("responses", {}).items())
        lines += [f"Responses: {codes}.", ""]
    return "\n".join(lines)


# --- the corrections ----------------------------------------------------------------------------


def methods_reference() -> str:
    from hubless.corrections import METHODS

    lines = ["| spec name | class | parameters (defaults) | tuning grid |", "|---|---|---|---|"]
    for name, cls in METHODS.items():
        params = ", ".join(f"{k}={v!r}" for k, v in cls().get_params().items() if k != "normalize")
        grid = getattr(cls, "default_grid", None)
        grid = grid() if callable(grid) else grid
        shown = "; ".join(f"{k} in {{{', '.join(map(str, v))}}}" for k, v in (grid or {}).items()) or "-"
        lines.append(f"| `{name}` | `{cls.__name__}` | {_cell(params) or '-'} | {_cell(shown)} |")
    return "\n".join(lines)


# --- the errors ---------------------------------------------------------------------------------


def _example(cls):
    """An instance of an error kind (their constructors differ; the mapping only looks at the kind)."""
    n_args = len(inspect.signature(cls.__init__).parameters) - 1
    return cls(*["example"] * max(1, n_args)) if n_args < 10 else cls("example")


def errors_reference() -> str:
    import hubless.errors as errors
    from hubless.service.errors import error_status

    lines = ["| kind | also a | CLI exit | HTTP status | when |", "|---|---|---|---|---|"]
    kinds = [getattr(errors, n) for n in errors.__all__ if isinstance(getattr(errors, n), type)]
    for cls in sorted(kinds, key=lambda c: (c is not errors.HublessError, c.__name__)):
        builtins = [b.__name__ for b in cls.__mro__[1:] if b.__module__ == "builtins" and b not in (Exception, BaseException, object)]
        status = "-" if cls is errors.HublessError else error_status(_example(cls))
        doc = inspect.getdoc(cls) or ""
        lines.append(f"| `{cls.__name__}` | {', '.join(builtins) or '-'} | 2 | {status} | {_cell(doc.split(chr(10) + chr(10))[0])} |")
    return "\n".join(lines)


GENERATORS = {"cli": cli_reference, "http": http_reference, "methods": methods_reference, "errors": errors_reference}
