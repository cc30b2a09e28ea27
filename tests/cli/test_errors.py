"""Typed errors (hubless.errors): the CLI maps only HublessError (and OSError) to exit 2 with
its message and treats anything else, a bug's KeyError or TypeError included, as a bug (exit 1,
traceback with --debug); the HTTP service maps the kinds to 404/409/503/422/500 and nothing
else to a 4xx. Real commands and a real app (FastAPI's TestClient); only the failure is provoked."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import hubless
from hubless import errors
from hubless.cli.main import app
from tests.conftest import unit_rows

runner = CliRunner()

#: Every kind with what the CLI and the service answer.
KINDS = [
    (errors.InvalidInput("bad k"), 422),
    (errors.InvalidType("k must be an int"), 422),
    (errors.NotFitted("fit first"), 422),
    (errors.NotFound("no item 7"), 404),
    (errors.MissingFile("no file x.npy"), 404),
    (errors.Conflict("another model"), 409),
    (errors.AlreadyExists("idx exists"), 409),
    (errors.Busy("locked for 30 s"), 503),
    (errors.Corrupt("checksum differs"), 500),
    (errors.MissingDependency("reports", "matplotlib", "report"), 500),
    (errors.Incomplete("rerun to finish"), 500),
]

#: What a bug looks like: builtins raised by code, not by hubless on purpose.
BUGS = [KeyError("oops"), TypeError("unsupported operand"), ValueError("math domain error"), IndexError("list index"), AttributeError("x")]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("errors")
    rng = np.random.default_rng(0)
    hubless.Index.build(unit_rows(rng, 120, 8), unit_rows(rng, 200, 8), "nnn:alpha=0.5,k=4", "Flat").save(root / "idx")
    return root / "idx"


def test_every_kind_derives_from_the_builtin_a_caller_catches():
    assert issubclass(errors.InvalidInput, ValueError) and issubclass(errors.InvalidType, TypeError)
    assert issubclass(errors.NotFound, KeyError) and issubclass(errors.MissingFile, FileNotFoundError)
    assert issubclass(errors.AlreadyExists, FileExistsError) and issubclass(errors.Busy, TimeoutError)
    assert issubclass(errors.MissingDependency, ImportError) and issubclass(errors.Incomplete, RuntimeError)
    for exc, _ in KINDS:
        assert isinstance(exc, errors.HublessError)
    assert str(errors.NotFound("no item 7")) == "no item 7"  # not KeyError's quoted repr


def _info_raising(monkeypatch, exc):
    def broken(self):
        raise exc

    monkeypatch.setattr(hubless.Index, "info", broken)


@pytest.mark.parametrize("exc", [k for k, _ in KINDS], ids=lambda e: type(e).__name__)
def test_cli_a_hubless_error_is_a_user_error_exit_2(index_dir, monkeypatch, exc):
    _info_raising(monkeypatch, exc)
    result = runner.invoke(app, ["index", "info", str(index_dir)])
    assert result.exit_code == 2, result.output
    assert f"error: {errors.message(exc)}" in " ".join(result.output.split())
    assert "bug" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("exc", BUGS, ids=lambda e: type(e).__name__)
def test_cli_a_builtin_error_is_a_bug_exit_1(index_dir, monkeypatch, exc):
    _info_raising(monkeypatch, exc)
    result = runner.invoke(app, ["index", "info", str(index_dir)])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert f"unexpected {type(exc).__name__}" in text and "a bug in hubless" in text and "--debug" in text
    assert "Traceback" not in result.output
    debug = runner.invoke(app, ["--debug", "index", "info", str(index_dir)])
    assert type(debug.exception) is type(exc)  # --debug lets the bug's traceback through


def test_cli_real_user_errors_exit_2(index_dir, tmp_path):
    missing = runner.invoke(app, ["index", "info", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "Traceback" not in missing.output
    np.save(tmp_path / "q.npy", np.ones((2, 5), np.float32))  # dimension 5, the index holds 8
    wrong_dim = runner.invoke(app, ["search", str(index_dir), "--queries", str(tmp_path / "q.npy")])
    assert wrong_dim.exit_code == 2 and "dimension" in wrong_dim.output, wrong_dim.output


# ---------------------------------------------------------------------- the service
fastapi = pytest.importorskip("fastapi")
from starlette.testclient import TestClient  # noqa: E402

from hubless.service import create_app  # noqa: E402


@pytest.fixture
def served(index_dir):
    index = hubless.Index.load(index_dir)
    with TestClient(base_url="http://localhost", app=create_app({"idx": index}), raise_server_exceptions=False) as client:
        yield client, index


def _search(client):
    return client.post("/search", json={"index": "idx", "embeddings": [[1.0] + [0.0] * 7], "top_k": 3})


@pytest.mark.parametrize(("exc", "status"), KINDS, ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v))
def test_service_maps_each_kind_to_its_status(served, monkeypatch, exc, status):
    client, index = served

    def broken(*args, **kwargs):
        raise exc

    monkeypatch.setattr(hubless.Index, "search", broken)  # requests search the version they pin
    response = _search(client)
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    if status >= 500:  # the server's problem (or a lock's): no detail that could leak a server path
        assert errors.message(exc) not in detail and ("internal error" in detail or status == 503 and "busy" in detail)
    else:
        assert detail == errors.message(exc)


@pytest.mark.parametrize("exc", BUGS, ids=lambda e: type(e).__name__)
def test_service_answers_a_bug_with_500_never_4xx(served, monkeypatch, exc):
    client, index = served

    def broken(*args, **kwargs):
        raise exc

    monkeypatch.setattr(hubless.Index, "search", broken)  # requests search the version they pin
    response = _search(client)
    assert response.status_code == 500, response.text
    assert "internal error" in response.json()["detail"] and "Traceback" not in response.text
    assert _health(client) == 200  # the server keeps running


def _health(client) -> int:
    return client.get("/health").status_code


def test_service_real_errors(served):
    client, _ = served
    assert client.get("/items/idx/100000").status_code == 404
    assert client.get("/items/nope/0").status_code == 404
    wrong_dim = client.post("/search", json={"index": "idx", "embeddings": [[1.0, 0.0]], "top_k": 3})
    assert wrong_dim.status_code == 422 and "dimension" in wrong_dim.json()["detail"]
