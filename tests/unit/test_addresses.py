"""Addresses as typed: a URL with a slash missing is refused with the URL it meant (exit 2, one
line), never read as a relative path; a path holding a colon stays a path."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mcsync.cli.main import cli
from mcsync.errors import UsageError
from mcsync.stores.registry import Location, parse_url


@pytest.mark.parametrize(("typed", "meant"), [
    ("s3:/bucket/x", "s3://bucket/x"),
    ("s3:bucket/x", "s3://bucket/x"),
    ("meta:b", "meta://b"),
    ("gs:/b", "gs://b"),
    ("az:b/run/", "az://b/run/"),
    ("S3:/b", "s3://b"),
])
def test_a_url_with_slashes_missing_is_refused_with_what_it_meant(typed, meant):
    with pytest.raises(UsageError, match=f"did you mean {meant}\\?"):
        parse_url(typed)


def test_file_colon_slash_is_rfc_8089s_short_form_of_a_path():
    assert parse_url("file:/data/run%207") == Location("file", "", "/data/run 7")
    with pytest.raises(UsageError, match="absolute path"):
        parse_url("file:data")


@pytest.mark.parametrize("path", ["run:7/", "./s3:b", "ckpt/step:12", "C:/models"])
def test_a_path_holding_a_colon_stays_a_path(path):
    assert parse_url(path) == Location("file", "", path)


def test_the_command_refuses_a_mistyped_url_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["sync", "s3:/bucket/x", "out"], catch_exceptions=False)
    assert result.exit_code == 2
    (line,) = result.output.splitlines()
    assert line.startswith("mcsync: error: s3:/bucket/x: ")
    assert "did you mean s3://bucket/x?" in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "s3:").exists()


def test_a_relative_source_with_a_colon_syncs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run:7").mkdir()
    (tmp_path / "run:7" / "a.bin").write_bytes(b"abc")
    result = CliRunner().invoke(cli, ["sync", "run:7/", "out/", "--no-manifest", "-q"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "a.bin").read_bytes() == b"abc"
