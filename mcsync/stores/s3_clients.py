"""The two clients of an S3 store, each built from the store's own settings alone.

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
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from .._version import __version__
from ..errors import ConfigError
from ..retry import RetryPolicy


@dataclass(frozen=True, slots=True)
class S3Credentials:
    """Explicit keys (meta:// and tests). ``None`` fields fall back to botocore's chain."""

    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None

    def __repr__(self) -> str:  # keys never reach a log through repr()
        return "S3Credentials(***)"


@dataclass(frozen=True, slots=True)
class ClientSettings:
    bucket: str
    endpoint_url: str | None
    region: str
    path_style: bool
    max_connections: int
    retry: RetryPolicy

    @property
    def sign_payload(self) -> bool:
        """Should botocore's bodies (UploadPart above all) be SHA-256-signed? Not where no one
        can change them on the way: over TLS, or to this machine (loopback). Each body still
        carries a CRC32C (or MD5) header the target checks, and that header is signed, as
        rclone sends UNSIGNED-PAYLOAD with Content-MD5. Elsewhere (plain HTTP across a
        network) the payload is signed. Hashing every byte with SHA-256 cost ~0.9 s of CPU per
        GiB here (~1.1 GiB/s), a fifth of an upload's client CPU."""
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


def make_obstore(settings: ClientSettings, creds: S3Credentials, *,
                 preflight: bool = False) -> Any:
    """obstore's client for one bucket. ``preflight``: tried ``retry.preflight_attempts``
    times only, so a wrong address fails in seconds (``Store.check``)."""
    from obstore.store import S3Store as ObStore

    config: dict[str, Any] = {
        "aws_region": settings.region,
        "aws_virtual_hosted_style_request": not settings.path_style,
        "aws_unsigned_payload": False,
        "aws_s3_express": False,
        # x-amz-checksum-sha256 on every PUT: the target verifies the body against it.
        "aws_checksum_algorithm": "sha256",
    }
    if settings.endpoint_url:
        config["aws_endpoint_url_s3"] = settings.endpoint_url
    kwargs: dict[str, Any] = {}
    if creds.access_key_id:
        config["aws_skip_signature"] = False
        frozen = {"access_key_id": creds.access_key_id,
                  "secret_access_key": creds.secret_access_key or "",
                  "token": creds.session_token, "expires_at": None}
        kwargs["credential_provider"] = lambda: frozen
    else:
        config["aws_skip_signature"] = True  # anonymous access to a public bucket
    endpoint = settings.endpoint_url or ""
    return ObStore(
        settings.bucket,
        config=config,
        client_options={
            "allow_http": endpoint.startswith("http:"),
            "pool_max_idle_per_host": str(settings.max_connections),
            "timeout": "300s",
            "connect_timeout": "10s",
        },
        retry_config=settings.retry.obstore(preflight=preflight),
        **kwargs,
    )


async def open_botocore(settings: ClientSettings, creds: S3Credentials,
                        profile: str | None) -> tuple[Any, Any, S3Credentials, str]:
    """botocore's client: (its context manager, the client, the keys it resolved, its
    region). Imported and started only when a request needs it (~0.2 s)."""
    from aiobotocore.config import AioConfig
    from aiobotocore.session import AioSession, get_session
    from botocore.exceptions import ProfileNotFound

    config = AioConfig(
        # A fixed User-Agent: botocore otherwise rebuilds its own from a dozen components
        # twice per request (~10% of the client CPU of a small-object server-side copy).
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
        # Bodies are s3_upload.Body (no copy of a part), a type botocore's validation does not
        # know; the parameters are ours, built in this package, never a user's.
        parameter_validation=False,
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
    cm = session.create_client(
        "s3",
        endpoint_url=settings.endpoint_url,
        region_name=settings.region or None,
        aws_access_key_id=creds.access_key_id,
        aws_secret_access_key=creds.secret_access_key,
        aws_session_token=creds.session_token,
        config=config,
        # Plain HTTP has no certificate to check: without this, every client still loads the
        # CA bundle into an SSL context (~40 ms of CPU) it will never use.
        verify=None if (settings.endpoint_url or "https:").startswith("https:") else False,
    )
    client = await cm.__aenter__()
    resolved = creds
    if not creds.access_key_id:  # the standard chain: env, profile, IMDS...
        chain = await session.get_credentials()
        if chain is not None:
            frozen = await chain.get_frozen_credentials()
            resolved = S3Credentials(frozen.access_key, frozen.secret_key, frozen.token)
    region = client.meta.region_name
    return cm, client, resolved, "us-east-1" if region in (None, "aws-global") else region


def parse_timestamp(value: Any) -> datetime:
    """Timestamps of S3 responses: ISO 8601 in XML bodies, RFC 1123 in headers. botocore's
    default parser (dateutil) takes ~0.15 ms a value, a tenth of the client CPU of a small
    CopyObject; the standard library parses both forms in microseconds. Anything else goes to
    botocore's parser. Naive times are UTC, as botocore has them."""
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
