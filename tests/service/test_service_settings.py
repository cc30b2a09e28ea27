"""The service's settings are declared once (issue 40 item 5): each field of
:class:`hubless.service.settings.ServeSettings` is a ``hubless serve`` option with its help text,
read from ``HUBLESS_SERVE_*`` when the option is not given, checked with an
:class:`hubless.errors.InvalidInput` naming it, and handed to the worker processes as it is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pydantic_settings", reason="the serve extra installs pydantic-settings")
pytest.importorskip("fastapi", reason="the serve extra installs fastapi")

from typer.testing import CliRunner  # noqa: E402

from hubless.cli.main import app  # noqa: E402
from hubless.errors import InvalidInput  # noqa: E402
from hubless.service.settings import DEFAULT_HOSTS, BankLearning, Keys, Limits, Option, ServeSettings, Settings  # noqa: E402


def _flags():
    """Every option flag the settings declare, with its field's description."""
    flags = {}
    for model in (ServeSettings, Limits, BankLearning):
        for name, field in model.model_fields.items():
            option = next((m for m in field.metadata if isinstance(m, Option)), Option())
            if option.flag is None or name in ("limits", "learning"):
                continue
            flags[option.flag or "--" + name.replace("_", "-")] = field.description
    return flags


def test_serve_help_shows_every_setting_with_its_help():
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    flags = _flags()
    assert len(flags) >= 25 and "--max-batch" in flags and "--allowed-host" in flags and "--trusted-proxy" in flags
    for flag, description in flags.items():
        assert f"{flag} " in text, flag
        assert description and description.split(" (")[0][:40] in text, (flag, description)


def test_help_imports_no_pydantic():
    """`hubless --help` stays fast: the serve options are built only when serve needs them."""
    code = "import sys; from hubless.cli.main import app; print(sorted(m for m in ('pydantic', 'pydantic_settings', 'fastapi') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_options_given_win_over_the_environment_which_wins_over_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("HUBLESS_SERVE_LIMITS__MAX_TOP_K", "0")  # refused when it applies
    result = CliRunner().invoke(app, ["serve", str(tmp_path)])
    assert result.exit_code == 2 and "max_top_k" in result.output, result.output
    result = CliRunner().invoke(app, ["serve", str(tmp_path), "--max-top-k", "5", "--lock-timeout", "0"])
    assert result.exit_code == 2 and "lock_timeout" in result.output and "max_top_k" not in result.output, result.output
    monkeypatch.setenv("HUBLESS_SERVE_LIMITS__MAX_TOP_K", "7")
    monkeypatch.setenv("HUBLESS_SERVE_CORS_ORIGINS", '["https://a.example"]')
    settings = ServeSettings(rate_burst=9)
    assert settings.limits.max_top_k == 7 and settings.cors_origins == ("https://a.example",) and settings.rate_burst == 9


def test_bad_values_are_invalid_input_naming_the_setting(tmp_path):
    for values, name in [
        ({"rate_limit": True}, "rate_limit"),
        ({"rate_limit": float("inf")}, "rate_limit"),
        ({"limits": {"max_batch": 0}}, "max_batch"),
        ({"lock_timeout": 3600}, "lock_timeout"),
        ({"workers": 0}, "workers"),
        ({"port": 70000}, "port"),
        ({"max_batch": 5}, "max_batch"),  # a limit goes inside limits
    ]:
        with pytest.raises(InvalidInput, match=name):
            ServeSettings(**values)
    with pytest.raises(InvalidInput, match="together"):
        ServeSettings(tls_cert=__file__)
    with pytest.raises(InvalidInput, match="not a file"):
        ServeSettings(tls_cert=tmp_path / "none.pem", tls_key=__file__)
    with pytest.raises(InvalidInput, match="max_top_k"):
        Limits(max_top_k=-1)


def test_derived_defaults_and_the_copy_each_worker_reads(tmp_path):
    (tmp_path / "write.key").write_text("w" * 32)
    settings = ServeSettings(host="10.0.0.5", workers=2, api_key_file=tmp_path / "write.key", audit_log="audit.jsonl")
    assert settings.allowed_hosts == (*DEFAULT_HOSTS, "10.0.0.5") and settings.writes is False
    assert settings.keys.write == "w" * 32 and settings.audit_log == Path("audit.jsonl").absolute()
    assert ServeSettings(host="0.0.0.0").allowed_hosts == DEFAULT_HOSTS and ServeSettings().writes is True
    dumped = settings.model_dump_json()
    assert "w" * 32 not in dumped and "keys" not in json.loads(dumped)  # the worker reads the key file itself
    again = ServeSettings(**json.loads(dumped))
    assert again == settings and again.keys.write == "w" * 32
    # the library's Settings: keys given as an object, or read from files
    assert Settings(keys=Keys(write="k" * 20)).keys.required and not Settings().keys.required
    assert Settings(api_key_file=tmp_path / "write.key").keys.write == "w" * 32
