"""`hubless data fetch visogender`: pinned, checksummed files from a download or a local folder;
clear messages offline and on a mismatch; then `hubless data visogender` reads them."""

from __future__ import annotations

import urllib.error
import urllib.request

from typer.testing import CliRunner

from hubless.cli.main import app
from hubless.data import visogender as vg
from hubless.data.karpathy import data_dir
from tests.conftest import needs_shared

runner = CliRunner()
SHARED = data_dir() / "visogender"


@needs_shared("visogender")
def test_fetch_from_a_local_folder_then_build_the_audit_data(tmp_path, monkeypatch):
    result = runner.invoke(app, ["data", "fetch", "visogender", "--dest", str(tmp_path / "data"), "--archive", str(SHARED)])
    assert result.exit_code == 0, result.output
    for name in vg.VISOGENDER_FILES:
        assert (tmp_path / "data" / "visogender" / name).read_bytes() == (SHARED / name).read_bytes()
    monkeypatch.setenv("HUBLESS_DATA_DIR", str(tmp_path / "data"))
    built = runner.invoke(app, ["data", "visogender", "--out", str(tmp_path / "vg")])
    assert built.exit_code == 0, built.output
    assert (tmp_path / "vg" / "gallery_meta.csv").is_file()


@needs_shared("visogender")
def test_download_path_is_verified(tmp_path, monkeypatch):
    files = {name: ((SHARED / name).as_uri(), digest) for name, (_, digest) in vg.VISOGENDER_FILES.items()}
    monkeypatch.setattr(vg, "VISOGENDER_FILES", files)  # file:// URLs: the real download code, no network
    written = vg.fetch_visogender(tmp_path)
    assert sorted(p.name for p in written) == sorted(files)
    tampered = tmp_path / "src"
    tampered.mkdir()
    for name in files:
        (tampered / name).write_bytes((SHARED / name).read_bytes() + b"\nextra")
    out = tmp_path / "out"
    result = runner.invoke(app, ["data", "fetch", "visogender", "--dest", str(out), "--archive", str(tampered)])
    assert result.exit_code == 2 and "pinned" in result.output and "--no-verify" in result.output
    assert not out.exists()  # nothing written
    forced = runner.invoke(app, ["data", "fetch", "visogender", "--dest", str(out), "--archive", str(tampered), "--no-verify"])
    assert forced.exit_code == 0, forced.output


def test_offline_and_missing_files_give_clear_messages(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    result = runner.invoke(app, ["data", "fetch", "visogender", "--dest", str(tmp_path)])
    assert result.exit_code == 2 and "no network" in result.output and "--archive" in result.output
    assert "Traceback" not in result.output and not any(tmp_path.iterdir())
    monkeypatch.setenv("HUBLESS_DATA_DIR", str(tmp_path))
    missing = runner.invoke(app, ["data", "visogender", "--out", str(tmp_path / "vg")])
    assert missing.exit_code == 2 and "hubless data fetch visogender" in missing.output
