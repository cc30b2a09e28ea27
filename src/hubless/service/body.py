"""JSON request bodies, parsed off the event loop with their shape bounded before anything is built.

A JSON body is read (at most ``Limits.max_body_bytes``, counted by :class:`hubless.service.guard.Guard`),
then in a worker thread (the event loop keeps answering other requests meanwhile):

1. a scan of the raw bytes counts the arrays and objects, their nesting depth and the elements
   (commas) outside strings, and stops at the first limit passed: at most
   :data:`CONTAINERS_PER_ROW` arrays or objects per row of ``max_batch`` (plus
   :data:`CONTAINER_SLACK`), nesting at most :data:`MAX_DEPTH` deep, and at most
   ``max_batch x (the largest served dimension + FIELDS_PER_ROW)`` elements. The scan costs
   C-speed byte counts on an ordinary body and one Python step per bracket, never one per value,
   so a body that passes it can be built in memory within a small multiple of its size, and
   one that does not is refused before a single Python object is made of it (an 8 MiB
   ``{"embeddings": [[0], [0], ...]}`` of 2.1M rows is refused after ~3,000 brackets);
2. orjson parses it;
3. the lists of rows are checked against ``max_batch`` (and the rows against the index's
   dimension by the routes) before pydantic validates the request model, strictly (no string for
   a number, no boolean for an integer).

So no body can hold the event loop (``/health`` keeps answering) or take more than a bounded
multiple of its size in memory.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from hubless.index.filters import MAX_DEPTH as FILTER_DEPTH
from hubless.service.settings import Limits

__all__ = ["CONTAINERS_PER_ROW", "MAX_DEPTH", "ROW_FIELDS", "BodyShape", "check_content_type", "json_body", "parse_json", "read_json"]

#: Arrays and objects a body may hold per row of ``max_batch`` (a row, its metadata record and
#: a few list or object values inside it), plus :data:`CONTAINER_SLACK` for the rest.
CONTAINERS_PER_ROW = 8
CONTAINER_SLACK = 1024
#: Deepest nesting of arrays and objects: what a ``where`` nested as deep as the library takes
#: (:data:`hubless.index.filters.MAX_DEPTH` levels of ``$and`` / ``$or``) needs in a body: the
#: body and the filter objects, two per level (the list and the filter in it), the leaf's
#: condition and its ``in`` list. One constant: the documented depth is the served one.
MAX_DEPTH = 2 * FILTER_DEPTH + 4
#: Elements a body may hold per row beyond the embedding's dimension (metadata fields).
FIELDS_PER_ROW = 64
ELEMENT_SLACK = 4096
#: Top-level fields that are lists of rows: each at most ``max_batch`` long.
ROW_FIELDS = ("embeddings", "texts", "images", "metadata", "ids")

_BRACKETS = re.compile(rb'[\[\]{}"]')
_BRACKETS_AND_COMMAS = re.compile(rb'[\[\]{},"]')
_STRING_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # from after an opening quote to its closing one

Model = TypeVar("Model", bound=BaseModel)


class BodyShape:
    """The limits of a body's shape for one application: ``max_batch`` rows of at most ``max_dim``
    values each (the largest dimension served)."""

    def __init__(self, limits: Limits, max_dim: int) -> None:
        self.max_batch = limits.max_batch
        self.containers = CONTAINERS_PER_ROW * limits.max_batch + CONTAINER_SLACK
        self.elements = limits.max_batch * (max_dim + FIELDS_PER_ROW) + ELEMENT_SLACK

    def check_raw(self, raw: bytes) -> None:
        """Refuse (422) a body whose arrays, objects, nesting or elements pass the limits, before it is parsed."""
        opened = raw.count(b"[") + raw.count(b"{")  # an upper bound (brackets inside strings count too)
        if opened > MAX_DEPTH:  # could be too many or too deep: count outside strings, stopping at a limit
            containers, depth, _ = _scan(raw, _BRACKETS, self.containers, None)
            if containers > self.containers:
                raise HTTPException(
                    422,
                    f"the body holds more than {self.containers} arrays and objects "
                    f"(at most {CONTAINERS_PER_ROW} per row of max_batch={self.max_batch}, plus {CONTAINER_SLACK})",
                )
            if depth > MAX_DEPTH:
                raise HTTPException(422, f"the body nests arrays and objects more than {MAX_DEPTH} deep")
        if raw.count(b",") >= self.elements:  # an upper bound again; count outside strings
            _, _, commas = _scan(raw, _BRACKETS_AND_COMMAS, None, self.elements)
            if commas >= self.elements:
                raise HTTPException(
                    422,
                    f"the body holds more than {self.elements} values "
                    f"(max_batch={self.max_batch} rows of the largest served dimension, plus {FIELDS_PER_ROW} fields each)",
                )

    def check_rows(self, value: Any) -> None:
        """Refuse (422) a parsed body that is not an object or has more than ``max_batch`` rows in a list of rows."""
        if not isinstance(value, dict):
            raise HTTPException(422, f"the body must be a JSON object; got {_kind(value)}")
        for name in ROW_FIELDS:
            rows = value.get(name)
            if isinstance(rows, list) and len(rows) > self.max_batch:
                raise HTTPException(422, f"{len(rows)} {name} exceed the limit max_batch={self.max_batch}")


def _scan(raw: bytes, tokens: re.Pattern, max_containers: int | None, max_commas: int | None) -> tuple[int, int, int]:
    """(arrays and objects opened, deepest nesting, commas) outside strings, stopping as soon as
    ``max_containers``, :data:`MAX_DEPTH` or ``max_commas`` is passed. One Python step per token:
    the regex engine skips numbers and strings in C (and the thread gives up the GIL between steps)."""
    containers = depth = deepest = commas = 0
    pos = 0
    search, string_rest = tokens.search, _STRING_REST.match
    while True:
        found = search(raw, pos)
        if found is None:
            break
        char = raw[found.start()]
        pos = found.end()
        if char == 0x22:  # '"': skip the string
            end = string_rest(raw, pos)
            if end is None:  # unterminated: the parser says so
                break
            pos = end.end()
        elif char in (0x5B, 0x7B):  # '[' '{'
            containers += 1
            depth += 1
            deepest = max(deepest, depth)
            if (max_containers is not None and containers > max_containers) or deepest > MAX_DEPTH:
                break
        elif char == 0x2C:  # ','
            commas += 1
            if max_commas is not None and commas >= max_commas:
                break
        else:
            depth -= 1
    return containers, deepest, commas


def _kind(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(type(value), "null")


def parse_json(raw: bytes, model: type[Model], shape: BodyShape) -> Model:
    """The request model from the body ``raw`` (the steps of the module docstring; run it in a
    worker thread). Bad bodies raise a 422 (HTTPException or RequestValidationError)."""
    import orjson

    if not raw.strip():
        raise HTTPException(422, "the body is empty: send a JSON object")
    shape.check_raw(raw)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        hint = "; NaN and Infinity are not JSON numbers" if b"NaN" in raw or b"Infinity" in raw else ""
        raise HTTPException(422, f"invalid request: the body is not valid JSON: {str(exc)[:200]}{hint}") from None
    shape.check_rows(value)
    try:
        return model.model_validate(value, strict=True)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]) from None


#: Every model a route reads its JSON body as (filled by :func:`json_body`): the OpenAPI schema's
#: components list each one (:func:`hubless.service.app.create_app`).
BODY_MODELS: dict[str, type[BaseModel]] = {}


def json_body(model: type[BaseModel]) -> dict:
    """The ``openapi_extra`` of a route whose JSON body is ``model`` (its schema is added to the
    components by :func:`hubless.service.app.create_app`)."""
    BODY_MODELS[model.__name__] = model
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "responses": {"422": {"description": "A bad request: its shape, types or limits (the detail names which)."}},
    }


def check_content_type(request: Request) -> None:
    """Refuse (415) a body sent as anything but JSON (``application/json`` or ``...+json``; no
    content type is taken as JSON), so a browser form cannot pass for a JSON request."""
    given = request.headers.get("content-type")
    if given is None:
        return
    kind = given.split(";", 1)[0].strip().lower()
    if kind != "application/json" and not (kind.startswith("application/") and kind.endswith("+json")):
        raise HTTPException(415, f"send the body as JSON (content-type: application/json); got {given[:100]!r}")


async def read_json(request: Request, model: type[Model]) -> Model:
    """The body of ``request`` as ``model``: read on the event loop (bounded by ``max_body_bytes``),
    parsed and validated in a worker thread by :func:`parse_json`."""
    from starlette.concurrency import run_in_threadpool

    check_content_type(request)
    raw = await request.body()
    return await run_in_threadpool(parse_json, raw, model, request.app.state.service.body_shape)
