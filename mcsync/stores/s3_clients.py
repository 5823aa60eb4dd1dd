"""The two clients of an S3 store, each built from the store's own settings alone (the keys
they sign with: ``s3_keys``).

obstore reads every ``AWS_*`` variable of the process, and some beat explicit arguments
(``AWS_ENDPOINT_URL_S3`` wins over ``endpoint=``; ``AWS_SESSION_TOKEN`` is attached to keys
given without one). Nothing here changes the environment: the endpoint is given under the
config key that variable maps to (``aws_endpoint_url_s3``, where an explicit value wins), keys
come from a credential provider (which replaces the environment's keys and token), and the
settings that change what a request means — region, addressing, signing, payload signing,
S3 Express — are given explicitly. Variables that only add to a request (server-side
encryption, requester pays) still reach obstore's requests, as they would the AWS CLI's.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .._version import __version__
from ..errors import ConfigError
from ..retry import RetryPolicy
from .s3_keys import Keys, S3Credentials

if TYPE_CHECKING:
    from obstore.store import ClientConfig, S3Config

class _Given:
    """A botocore ``credential_provider`` component that resolves to credentials already held."""

    def __init__(self, creds: Any) -> None:
        self._creds = creds

    async def load_credentials(self) -> Any:
        return self._creds


@dataclass(frozen=True, slots=True)
class ClientCert:
    """A client certificate and its private key (PEM files) that every request presents in its
    TLS handshake (mutual TLS). Only the paths are held: each client reads the files itself,
    and the key's path may be named in errors, its contents never (not in repr either)."""

    cert: str
    key: str

    @classmethod
    def read(cls, cert: str, key: str | None) -> ClientCert:
        """The pair, checked before any request: each file readable and PEM of its kind, and
        the key the certificate's (``key`` None: a file holding both). ConfigError naming the
        file otherwise; nothing of the key's contents reaches a message."""
        import ssl  # the check's alone; every TLS client imports it anyway

        key = key or cert
        cert_text = _pem_text(cert, "client certificate")
        if "-----BEGIN CERTIFICATE-----" not in cert_text:
            raise ConfigError(f"client certificate {cert}: no PEM certificate in it")
        key_text = cert_text if key == cert else _pem_text(key, "client key")
        if not re.search(r"-----BEGIN [A-Z ]*PRIVATE KEY-----", key_text):
            hint = " (give its key with --client-key / client_key)" if key == cert else ""
            raise ConfigError(f"client key {key}: no PEM private key in it{hint}")
        if "ENCRYPTED" in key_text:  # PKCS#8 "ENCRYPTED PRIVATE KEY" or "Proc-Type: 4,ENCRYPTED"
            raise ConfigError(f"client key {key}: encrypted with a passphrase; mcsync needs "
                              "it unencrypted (readable by this user alone)")
        del key_text
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            # A password callback, so that OpenSSL never prompts on the terminal.
            context.load_cert_chain(cert, key, password=_no_password)
        except ssl.SSLError as exc:
            if exc.reason == "KEY_VALUES_MISMATCH":
                raise ConfigError(f"client certificate {cert} and key {key} do not match (the "
                                  "key is not the certificate's)") from None
            raise ConfigError(f"client certificate {cert} / key {key}: cannot load them "
                              f"({exc.reason or 'not PEM'})") from None
        except OSError as exc:  # replaced or removed since it was read above
            raise ConfigError(f"client certificate {cert} / key {key}: cannot read them "
                              f"({exc.strerror or type(exc).__name__})") from None
        return cls(cert, key)

    def __repr__(self) -> str:
        return f"ClientCert(cert={self.cert!r}, key={self.key!r})"


def _pem_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read it "
                          f"({exc.strerror or type(exc).__name__})") from None


def _no_password() -> bytes:
    return b""


@dataclass(frozen=True, slots=True)
class ClientSettings:
    bucket: str
    endpoint_url: str | None
    region: str
    path_style: bool
    max_connections: int
    retry: RetryPolicy
    ca_bundle: str | None = None  # a PEM file of extra CAs to trust (AWS_CA_BUNDLE)
    ca_pem: str | None = None  # its text (``read_ca_bundle``), for obstore
    client_cert: ClientCert | None = None  # presented in every handshake (mutual TLS)

    @property
    def tls(self) -> bool:
        return uses_tls(self.endpoint_url)

    @property
    def sign_payload(self) -> bool:
        """Should botocore's bodies (UploadPart above all) be SHA-256-signed? Not where no one
        can change them on the way: over TLS, or to this machine (loopback). Each body still
        carries a CRC32C (or MD5) header the target checks, and that header is signed, as
        rclone sends UNSIGNED-PAYLOAD with Content-MD5. Elsewhere (plain HTTP across a
        network) the payload is signed: hashing every byte with SHA-256 is a large part of an
        upload's client CPU (figures: benchmarks/README.md)."""
        url = self.endpoint_url or "https://s3.amazonaws.com"
        parts = urlsplit(url)
        if parts.scheme == "https":
            return False
        host = parts.hostname or ""
        if host == "localhost":
            return False
        try:
            return not ipaddress.ip_address(host).is_loopback
        except ValueError:
            return True


# obstore's requests run on a Rust runtime whose threads a forked child does not have: there a
# request would wait forever (a data loader forks its workers). A child forked after obstore
# was used sends everything through botocore instead (``S3Clients.botocore_only``).
_OBSTORE = {"used": False, "forked_after_use": False}


def _after_fork_in_child() -> None:
    _OBSTORE["forked_after_use"] = _OBSTORE["used"]


os.register_at_fork(after_in_child=_after_fork_in_child)


def obstore_forked() -> bool:
    """Was this process forked from one that had used obstore (whose runtime it lacks)?"""
    return _OBSTORE["forked_after_use"]


def make_obstore(settings: ClientSettings, keys: Keys, *, preflight: bool = False) -> Any:
    """obstore's client for one bucket. ``preflight``: tried ``retry.preflight_attempts``
    times only, so a wrong address fails in seconds (``Store.check``)."""
    from obstore.store import S3Store as ObStore

    _OBSTORE["used"] = True

    # Each key names the setting its AWS_* variable sets (``region`` is ``aws_region``, which
    # AWS_REGION maps to), so an explicit value here replaces the environment's.
    config: S3Config = {
        "region": settings.region,
        "virtual_hosted_style_request": not settings.path_style,
        "unsigned_payload": False,
        "s3_express": False,
        # x-amz-checksum-sha256 on every PUT: the target verifies the body against it.
        "checksum_algorithm": "sha256",
        "skip_signature": keys.anonymous,  # anonymous: a public bucket
    }
    if settings.endpoint_url:
        config["aws_endpoint_url_s3"] = settings.endpoint_url
    kwargs: dict[str, Any] = {}
    if not keys.anonymous:
        kwargs["credential_provider"] = keys.obstore_provider()
    endpoint = settings.endpoint_url or ""
    client_options: ClientConfig = {
        "allow_http": endpoint.startswith("http:"),
        "pool_max_idle_per_host": str(settings.max_connections),
        "timeout": "300s",
        "connect_timeout": "10s",
    }
    if settings.ca_pem is not None and settings.tls:
        # Added to the system's roots, as botocore's verify=<bundle> trusts the bundle: the
        # AWS_CA_BUNDLE a private endpoint needs was botocore's alone, and every listing,
        # GET and small PUT (obstore's) failed as "cannot reach" the endpoint.
        client_options["root_certificate"] = settings.ca_pem
    return ObStore(
        settings.bucket,
        config=config,
        client_options=client_options,
        retry_config=settings.retry.obstore(preflight=preflight),
        **kwargs,
    )


def uses_tls(endpoint_url: str | None) -> bool:
    """Is the endpoint https (AWS's own, when none is given)?"""
    return (endpoint_url or "https:").startswith("https:")


def read_ca_bundle(path: str) -> str:
    """The PEM text of a CA bundle file; ConfigError naming the file if it cannot be read or
    holds no certificate (read once, when the store is made: before any request)."""
    try:
        text = Path(path).read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise ConfigError(f"CA bundle {path}: cannot read it "
                          f"({exc.strerror or type(exc).__name__})") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise ConfigError(f"CA bundle {path}: no PEM certificate in it")
    return text


async def open_botocore(settings: ClientSettings, keys: Keys | None,
                        profile: str | None) -> tuple[Any, Any, Keys, str]:
    """botocore's client: (its context manager, the client, its keys, its region); ``keys``
    None: the standard chain's (kept refreshable where the source can refresh). Imported
    and started only when a request needs it: its start is a cost a run may never need."""
    from aiobotocore.config import AioConfig
    from aiobotocore.session import AioSession, get_session
    from botocore.exceptions import ProfileNotFound

    config = AioConfig(
        # A fixed User-Agent: botocore otherwise rebuilds its own from a dozen components
        # twice per request, a visible share of the client CPU of small requests.
        user_agent=f"mcsync/{__version__}",
        max_pool_connections=settings.max_connections,
        retries=settings.retry.botocore(),
        s3={"addressing_style": "path" if settings.path_style else "auto",
            "payload_signing_enabled": settings.sign_payload},
        connect_timeout=10,
        read_timeout=120,
        tcp_keepalive=True,
        # Part and object checksums are computed by us (CRC32C, off the event loop);
        # botocore's default would add a CRC32 computed on the event loop (over https as
        # aws-chunked trailers, which some S3-compatibles reject).
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        # Bodies are s3_body.Body (no copy of a part), a type botocore's validation does not
        # know; the parameters are ours, built in this package, never a user's.
        parameter_validation=False,
        # Mutual TLS: presented in every handshake (aiohttp's SSL context loads the pair).
        client_cert=((settings.client_cert.cert, settings.client_cert.key)
                     if settings.client_cert is not None and settings.tls else None),
    )
    session: AioSession = get_session()
    if profile:
        try:
            session = AioSession(profile=profile)
            await session.get_credentials()
        except ProfileNotFound:
            raise ConfigError(f"AWS profile {profile!r} not found") from None
    session.get_component("response_parser_factory").set_parser_defaults(
        timestamp_parser=parse_timestamp)
    explicit = S3Credentials()
    if keys is not None and keys.refreshable is not None:
        # The client signs with the very object obstore's provider reads: one refresh, both.
        session.register_component("credential_provider", _Given(keys.refreshable))
    elif keys is not None:
        explicit = keys.fixed
    cm = session.create_client(
        "s3",
        endpoint_url=settings.endpoint_url,
        region_name=settings.region or None,
        aws_access_key_id=explicit.access_key_id,
        aws_secret_access_key=explicit.secret_access_key,
        aws_session_token=explicit.session_token,
        config=config,
        # Plain HTTP has no certificate to check: without this, every client still loads the
        # CA bundle into an SSL context it will never use.
        verify=(settings.ca_bundle or None) if settings.tls else False,
    )
    client = await cm.__aenter__()
    if keys is None:  # the standard chain: env, profile, assume-role, SSO, IMDS...
        chain = await session.get_credentials()  # the object the client signs with
        keys = await Keys.from_botocore(chain) if chain is not None else Keys()
    region = client.meta.region_name
    return cm, client, keys, "us-east-1" if region in (None, "aws-global") else region


def parse_timestamp(value: Any) -> datetime:
    """Timestamps of S3 responses: ISO 8601 in XML bodies, RFC 1123 in headers. botocore's
    default parser (dateutil) is a large share of the client CPU of a small CopyObject; the
    standard library parses both forms far quicker. Anything else goes to botocore's parser.
    Naive times are UTC, as botocore has them."""
    import email.utils  # with botocore only, which has imported it already

    parsed: datetime | None = None
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            parsed = datetime.fromisoformat(value)
        if parsed is None:
            with contextlib.suppress(TypeError, ValueError):
                parsed = email.utils.parsedate_to_datetime(value)
    if parsed is None:
        from botocore.utils import parse_timestamp as botocore_parse

        parsed = botocore_parse(value)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
