"""URL → Store. The only place that knows which schemes exist and where their settings live.

A store is given ``StoreOptions``, the few settings that concern it, never a run's options.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from ..config import DEFAULT_CONCURRENCY, StoreOptions
from ..errors import UsageError
from .base import ReadStore
from .local import LocalStore
from .s3 import S3Credentials, S3Store

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,253}[a-z0-9]$")
_IPV4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")
META_CONFIG = Path("~/.config/mcsync/config.toml")


@dataclass(frozen=True, slots=True)
class Location:
    scheme: str  # "s3", "meta", "gs", "az" or "file"
    bucket: str  # "" for file
    prefix: str  # bucket prefix ("" or ends with "/"), or the filesystem path for file


def parse_url(url: str) -> Location:
    """Split a source/target address; raises UsageError naming what is wrong."""
    if not url:
        raise UsageError("empty address")
    shown = url if url.isprintable() else repr(url)  # one line, whatever the address holds
    if "://" not in url:
        return _without_slashes(url, shown)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise UsageError(f"{shown}: file:// URLs must be local (file:///path)")
        return Location("file", "", unquote(parts.path) or "/")
    if scheme not in ("s3", "meta", "gs", "az"):
        raise UsageError(f"{shown}: unknown scheme {scheme!r} (use s3://, meta://, gs://, "
                         "az:// or a path)")
    # Keep the raw path: keys may hold '%', '?', '#' and must not be URL-decoded.
    rest = url.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    if not bucket or not _BUCKET.fullmatch(bucket):
        raise UsageError(f"{shown}: {bucket!r} is not a valid bucket name")
    if _IPV4.fullmatch(bucket):
        # S3's rules: a bucket name is never formatted as an IP address (it would also make
        # virtual-hosted addressing send the request to that address)
        raise UsageError(f"{shown}: {bucket!r} is not a valid bucket name (an IP address; an "
                         "endpoint's address goes in --endpoint-url or MCSYNC_META_ENDPOINT_URL)")
    prefix = prefix.lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"  # a prefix names a "directory", as in rclone and aws s3 sync
    return Location(scheme, bucket, prefix)


_SCHEMES = ("s3", "meta", "gs", "az")
_SCHEME_COLON = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):(.*)$", re.DOTALL)


def _without_slashes(url: str, shown: str) -> Location:
    """An address without ``://``: a path, unless it begins with a scheme of ours and a colon
    (``s3:/b``, ``meta:b``, ``gs:/b/x``): a URL with a slash or two missing, refused with the
    URL it probably meant rather than read as a relative directory ``s3:``. ``file:/path`` is
    RFC 8089's short form of ``file:///path``; any other ``word:rest`` (``run:7/``) is a
    path. A file really named so is given as ``./s3:b``."""
    found = _SCHEME_COLON.match(url)
    if found is None:
        return Location("file", "", url)
    scheme, rest = found.group(1).lower(), found.group(2)
    if scheme in _SCHEMES:
        meant = f"{scheme}://{rest.lstrip('/')}"
        raise UsageError(f"{shown}: not a URL (one or both slashes after '{scheme}:' "
                         f"missing): did you mean {meant}? (a local path: ./{url})")
    if scheme == "file" and not rest.startswith("/"):
        raise UsageError(f"{shown}: a file: URL names an absolute path (file:///path); a "
                         f"relative path is given as ./{url}")
    if scheme == "file":
        return Location("file", "", unquote(rest))
    return Location("file", "", url)


__all__ = ["Location", "StoreOptions", "meta_settings", "open_store", "parse_url"]


def open_store(url: str, options: StoreOptions | None = None) -> ReadStore:
    """The store an address names (``s3://``, ``meta://``, ``gs://``, ``az://``, a path),
    yours to close (``await store.aclose()``). A ``gs://`` or ``az://`` store is a
    ``ReadStore`` only; the others are writable ``Store``s. Raises UsageError for an address
    that names no store; nothing is sent until the store is used."""
    options = options or StoreOptions()
    connections = options.max_connections or DEFAULT_CONCURRENCY
    loc = parse_url(url)
    if loc.scheme == "file":
        return LocalStore(loc.prefix)
    if loc.scheme == "gs":
        from .gcs import GCSStore  # imported on use: aiohttp and the Google auth libraries

        return GCSStore(bucket=loc.bucket, prefix=loc.prefix,
                        max_connections=connections, retry=options.retry)
    if loc.scheme == "az":
        from .azure import AzureStore

        return AzureStore(container=loc.bucket, prefix=loc.prefix,
                          max_connections=connections, retry=options.retry)
    if loc.scheme == "s3":
        endpoint = (options.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3")
                    or os.environ.get("AWS_ENDPOINT_URL") or None)
        return S3Store(
            scheme="s3", bucket=loc.bucket, prefix=loc.prefix, endpoint_url=endpoint,
            region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"),
            profile=options.profile, max_connections=connections,
            retry=options.retry, ca_bundle=os.environ.get("AWS_CA_BUNDLE") or None,
            client_cert=options.client_cert, client_key=options.client_key,
        )
    meta = meta_settings()
    return S3Store(
        scheme="meta", bucket=loc.bucket, prefix=loc.prefix,
        endpoint_url=meta.get("endpoint_url"), region=meta.get("region") or "us-east-1",
        credentials=S3Credentials(meta.get("access_key_id"), meta.get("secret_access_key"),
                                  meta.get("session_token")),
        credential_process=meta.get("credential_process"),
        path_style=meta.get("path_style", "true").lower() not in ("0", "false", "no"),
        max_connections=connections, retry=options.retry,
        # botocore reads AWS_CA_BUNDLE whatever the store; meta:// may name its own
        ca_bundle=meta.get("ca_bundle") or os.environ.get("AWS_CA_BUNDLE") or None,
        client_cert=meta.get("client_cert"), client_key=meta.get("client_key"),
    )


def meta_settings(environ: dict[str, str] | None = None,
                  config_path: Path | None = None) -> dict[str, str]:
    """Meta Storage endpoint and keys: ``MCSYNC_META_*`` variables win over the profile named by
    ``MCSYNC_META_PROFILE`` (default ``default``) in ``~/.config/mcsync/config.toml``::

        [meta.default]
        endpoint_url = "https://meta.example.internal"
        access_key_id = "..."
        secret_access_key = "..."
        region = "us-east-1"
        path_style = true
        ca_bundle = "/etc/ssl/private-ca.pem"   # optional: a private CA (else AWS_CA_BUNDLE)
        client_cert = "/etc/mcsync/client.pem"  # optional: mutual TLS, with client_key
        client_key = "/etc/mcsync/client.key"

    or, for keys that expire, ``credential_process = "/path/to/command args"`` instead of the
    keys: run as the AWS CLI runs one (its JSON output, renewed before its Expiration).
    """
    env = os.environ if environ is None else environ
    path = (config_path or Path(env.get("MCSYNC_CONFIG", str(META_CONFIG)))).expanduser()
    settings: dict[str, str] = {}
    profile = env.get("MCSYNC_META_PROFILE", "default")
    if path.exists():
        section = _profile(path, profile)
        if section is None and "MCSYNC_META_PROFILE" in env:
            raise UsageError(f"{path}: no [meta.{profile}] profile")
        settings.update(section or {})
    elif "MCSYNC_META_PROFILE" in env:
        raise UsageError(f"MCSYNC_META_PROFILE={profile} but {path} does not exist")
    for name in _SETTINGS:
        value = env.get(f"MCSYNC_META_{name.upper()}")
        if value:
            settings[name] = value
    if not settings.get("endpoint_url"):
        raise UsageError("meta:// needs an endpoint: set MCSYNC_META_ENDPOINT_URL or "
                         f"endpoint_url in [meta.{profile}] of {path}")
    if settings.get("credential_process") and settings.get("access_key_id"):
        # Which should win is no guess to make for the user (the AWS CLI's order depends on
        # which file holds the keys).
        raise UsageError(f"meta:// profile {profile!r}: both access_key_id and "
                         "credential_process are set (MCSYNC_META_* or the config file); "
                         "keep one")
    return settings


_SETTINGS = ("endpoint_url", "access_key_id", "secret_access_key", "session_token", "region",
             "path_style", "credential_process", "ca_bundle", "client_cert", "client_key")


def _profile(path: Path, profile: str) -> dict[str, str] | None:
    """The ``[meta.<profile>]`` table of the config file, its values as strings; None when the
    file has no such profile. Raises UsageError, naming the file and what is wrong, for a file
    that cannot be read, is not TOML (the parser's line and column), or is not shaped as
    documented (``meta`` a table of tables of strings, booleans and numbers)."""
    import tomllib  # only a run with a config file parses TOML

    try:
        doc: dict[str, Any] = tomllib.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise UsageError(f"{path}: cannot read mcsync config: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: cannot read mcsync config: not UTF-8 text (byte "
                         f"{exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: cannot read mcsync config: {exc}") from None
    meta = doc.get("meta", {})
    if not isinstance(meta, dict):
        raise UsageError(f"{path}: 'meta' must be a table of profiles ([meta.{profile}])")
    section = meta.get(profile)
    if section is None:
        return None
    if not isinstance(section, dict):
        raise UsageError(f"{path}: [meta.{profile}] must be a table of settings")
    out = {}
    for k, v in section.items():
        if k not in _SETTINGS:
            raise UsageError(f"{path}: [meta.{profile}]: unknown setting {k!r} (known: "
                             f"{', '.join(_SETTINGS)})")
        if isinstance(v, bool):
            out[k] = "true" if v else "false"
        elif isinstance(v, str | int | float):
            out[k] = str(v)
        else:
            raise UsageError(f"{path}: [meta.{profile}] {k} must be a string, got "
                             f"{type(v).__name__}")
    return out
