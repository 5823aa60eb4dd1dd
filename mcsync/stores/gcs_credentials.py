"""What a GCS store trusts and signs with: the CA bundle of an https endpoint, and Google
credentials as Application Default Credentials find them (see ``gcs``), the file checked here
first: gcloud-aio-auth silently skips a file that is not valid JSON and tries the metadata
server instead, where a command-line tool must say what is wrong with the file. Messages name
the file, never what is in it."""

from __future__ import annotations

import json
import os
import ssl
from pathlib import Path

from ..errors import ConfigError

# Where a private CA bundle is read from, first found wins (see the module docstring).
CA_BUNDLE_VARIABLES = ("CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE", "REQUESTS_CA_BUNDLE")
_CREDENTIAL_TYPES = {"service_account", "authorized_user", "external_account",
                     "impersonated_service_account"}
_REQUIRED_FIELDS = {"service_account": ("client_email", "private_key"),
                    "authorized_user": ("client_id", "client_secret", "refresh_token")}


def find_credentials(explicit: str | None) -> tuple[str | None, str]:
    """The credentials file Application Default Credentials would use, checked, and a
    description of the source for messages; ``(None, ...)`` means the metadata server."""
    path = explicit or os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") or None
    if path:
        where = path if explicit else f"GOOGLE_APPLICATION_CREDENTIALS={path}"
        _check_credentials_file(Path(path), where)
        return path, where
    config = os.environ.get("CLOUDSDK_CONFIG") or str(Path("~/.config/gcloud").expanduser())
    well_known = Path(config, "application_default_credentials.json")
    if well_known.is_file():
        where = f"gcloud application-default credentials ({well_known})"
        _check_credentials_file(well_known, where)
        return str(well_known), where
    return None, "the metadata server (no GOOGLE_APPLICATION_CREDENTIALS, no gcloud login)"


def _check_credentials_file(path: Path, where: str) -> None:
    # Messages name the file, never what is in it.
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{where}: cannot read the credentials file: {reason}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise ConfigError(f"{where}: not a JSON credentials file") from None
    kind = data.get("type") if isinstance(data, dict) else None
    if kind not in _CREDENTIAL_TYPES:
        raise ConfigError(f"{where}: not a Google credentials file (type {kind!r}; expected "
                          f"one of {', '.join(sorted(_CREDENTIAL_TYPES))})")
    missing = [f for f in _REQUIRED_FIELDS.get(kind, ()) if not data.get(f)]
    if missing:
        raise ConfigError(f"{where}: {kind} credentials without {', '.join(missing)}")


def ca_bundle_from_env() -> str | None:
    for name in CA_BUNDLE_VARIABLES:
        value = os.environ.get(name)
        if value:
            return value
    return None


def tls_context(path: str | None, api_root: str, url: str) -> ssl.SSLContext | None:
    """The CA bundle's context for an https endpoint (None: OpenSSL's defaults); an
    unreadable bundle is a ConfigError naming it, before any request."""
    if not path or not api_root.startswith("https:"):
        return None
    try:
        return ssl.create_default_context(cafile=path)
    except ssl.SSLError:
        raise ConfigError(f"{url}: CA bundle {path}: no PEM certificate in it") from None
    except OSError as exc:  # missing, unreadable, a directory
        raise ConfigError(f"{url}: CA bundle {path}: "
                          f"{exc.strerror or type(exc).__name__}") from None
