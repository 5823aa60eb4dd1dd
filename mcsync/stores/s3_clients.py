"""The two clients of an S3 store, each built from the store's own settings alone.

obstore reads every ``AWS_*`` variable of the process, and some beat explicit arguments
(``AWS_ENDPOINT_URL_S3`` wins over ``endpoint=``; ``AWS_SESSION_TOKEN`` is attached to keys
given without one). Nothing here changes the environment: the endpoint is given under the
config key that variable maps to (``aws_endpoint_url_s3``, where an explicit value wins), keys
come from a credential provider (which replaces the environment's keys and token), and the
settings that change what a request means — region, addressing, signing, payload signing,
S3 Express — are given explicitly. Variables that only add to a request (server-side
encryption, requester pays) still reach obstore's requests, as they would the AWS CLI's.

Keys are ``Keys``: fixed ones, or botocore's credentials object when its source can refresh
(assume-role, web identity, credential_process, container and instance metadata, SSO). Both
clients use that one object: botocore signs with it, and obstore's (async) credential provider
hands out its current keys with their expiry, so obstore asks again shortly before they expire
and botocore's own refresh machinery renews them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .._version import __version__
from ..errors import AccessDenied, ConfigError, CredentialsExpired, MCSyncError, Transient
from ..retry import RetryPolicy
from .s3_errors import answer_of, translate, unclear_refusal

if TYPE_CHECKING:
    from obstore.store import ClientConfig, S3Config

# The profile name under which a meta:// credential_process is handed to botocore's provider.
_PROCESS_PROFILE = "mcsync-meta"


@dataclass(frozen=True, slots=True)
class S3Credentials:
    """Explicit keys (meta:// and tests). ``None`` fields fall back to botocore's chain."""

    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None

    def __repr__(self) -> str:  # keys never reach a log through repr()
        return "S3Credentials(***)"


@dataclass(frozen=True, slots=True, repr=False)
class KeySource:
    """Where a store's keys come from, decided when the store is made: a ``credential_process``
    command, fixed keys (given, or the environment's), or else botocore's standard chain.
    ``identity`` names who signs, for server-side copy between stores (same endpoint, same
    identity). For the chain it names the chain and its profile, not the key the chain will
    resolve to (known only after a request): two stores on the chain of one process resolve the
    same keys, while a chain store and a store given that very key are taken for different
    signers (a copy then passes through this client instead of the server)."""

    identity: str
    process: str | None = None
    fixed: S3Credentials | None = None

    def __repr__(self) -> str:  # a command line may carry a secret of its own
        return "KeySource(***)"

    @classmethod
    def of(cls, credentials: S3Credentials | None, credential_process: str | None,
           profile: str | None, environ: Mapping[str, str]) -> KeySource:
        """The source for what a store is given. The environment's keys are the chain's first
        step, taken without botocore when no profile is named (a named profile skips that
        step)."""
        if credential_process:
            return cls(f"process:{credential_process}", process=credential_process)
        if credentials is not None and credentials.access_key_id:
            return cls(credentials.access_key_id, fixed=credentials)
        key, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
        if not profile and not environ.get("AWS_PROFILE") and key and secret:
            return cls(key, fixed=S3Credentials(key, secret, environ.get("AWS_SESSION_TOKEN")))
        return cls(f"chain:{profile or environ.get('AWS_PROFILE') or ''}")


class Keys:
    """A store's keys: fixed ``S3Credentials``, or botocore's refreshable credentials object
    (then botocore's refresh machinery renews them, before expiry and when forced). The same
    object signs botocore's requests and feeds obstore's credential provider."""

    def __init__(self, fixed: S3Credentials | None = None, *, refreshable: Any = None) -> None:
        self.fixed = fixed or S3Credentials()
        self.refreshable = refreshable  # botocore RefreshableCredentials, or None

    def __repr__(self) -> str:  # keys never reach a log through repr()
        return f"Keys({'refreshable' if self.refreshable is not None else 'fixed'}, ***)"

    @classmethod
    async def from_botocore(cls, creds: Any) -> Keys:
        """What botocore's chain resolved: kept as is when it can refresh, else frozen."""
        from botocore.credentials import RefreshableCredentials

        if isinstance(creds, RefreshableCredentials):
            return cls(refreshable=creds)
        frozen = await creds.get_frozen_credentials()
        return cls(S3Credentials(frozen.access_key, frozen.secret_key, frozen.token))

    @property
    def anonymous(self) -> bool:
        return self.refreshable is None and not self.fixed.access_key_id

    async def current(self) -> tuple[S3Credentials, datetime | None]:
        """The keys to sign with now (refreshed by botocore if near expiry), and their expiry."""
        creds = self.refreshable
        if creds is None:
            return self.fixed, None
        frozen = await creds.get_frozen_credentials()
        # botocore has no public accessor for the expiry of its refreshable credentials.
        expiry = getattr(creds, "_expiry_time", None)
        return (S3Credentials(frozen.access_key, frozen.secret_key, frozen.token),
                expiry.astimezone(UTC) if isinstance(expiry, datetime) else None)

    async def force_refresh(self) -> bool:
        """Renew refreshable keys now (the endpoint refused them); whether the key changed.
        botocore has no public forced refresh: this is the call its own mandatory refresh
        makes, under the same lock."""
        creds = self.refreshable
        if creds is None:
            return False
        before, _ = await self.current()
        async with creds._refresh_lock:
            await creds._protected_refresh(is_mandatory=True)
        after, _ = await self.current()
        return after.access_key_id != before.access_key_id

    def obstore_provider(self) -> Any:
        """obstore's ``credential_provider``: fixed keys as they are (never expiring); else an
        async callable returning the current keys and their expiry. obstore caches what it is
        given until shortly before ``expires_at`` and then asks again."""
        if self.refreshable is None:
            fixed = self.fixed
            frozen = {"access_key_id": fixed.access_key_id or "",
                      "secret_access_key": fixed.secret_access_key or "",
                      "token": fixed.session_token, "expires_at": None}
            return lambda: frozen

        async def provide() -> dict[str, Any]:
            creds, expiry = await self.current()
            return {"access_key_id": creds.access_key_id or "",
                    "secret_access_key": creds.secret_access_key or "",
                    "token": creds.session_token, "expires_at": expiry}

        return provide


class Renewals:
    """Forced renewals of a store's keys after refusals. Each renewal makes a new generation;
    a request remembers the one it was sent in, so the refusals of one expiry ask for one
    renewal, not one each. The store makes the renewal (``renew``) before its next request."""

    def __init__(self, url: str, bucket: str) -> None:
        self.url = url
        self.bucket = bucket
        self.generation = 0
        self.wanted = False
        self._unclear = False
        self._lock = asyncio.Lock()
        # A generation whose key an unclear refusal (InvalidAccessKeyId, a bare 403) cannot
        # blame on age: the renewal that began it kept the key, or was itself for one.
        self._settled: int | None = None

    def refused(self, keys: Keys | None, error: MCSyncError, exc: BaseException,
                generation: int) -> MCSyncError:
        """What a refusal of keys sent in ``generation`` means, asking for a renewal where one
        may help. Sync: it runs inside the store's ``translating``."""
        refreshable = keys is not None and keys.refreshable is not None
        if isinstance(error, CredentialsExpired):
            if not refreshable:  # fixed keys stay expired: a configuration error
                return AccessDenied(f"{error} and cannot be renewed (fixed keys)")
            self._want(generation, unclear=False)
            return error
        if (refreshable and isinstance(error, AccessDenied) and generation != self._settled
                and unclear_refusal(answer_of(exc))):
            self._want(generation, unclear=True)
            return CredentialsExpired(f"{error}; renewing the keys")
        return error

    def _want(self, generation: int, *, unclear: bool) -> None:
        if generation == self.generation:  # else a renewal since has replaced those keys
            self.wanted = True
            self._unclear = unclear

    async def renew(self, keys: Keys | None) -> bool:
        """The forced renewal a refusal asked for, once however many requests were refused;
        whether one was made (the store then needs a new obstore client: a new credential
        cache)."""
        async with self._lock:
            if not self.wanted or keys is None:
                return False
            try:
                changed = await keys.force_refresh()
            except Exception as exc:
                raise self._failed(exc) from exc
            self.generation += 1
            # Unclear refusals of the new generation are real when the key stayed, or when an
            # unclear refusal already replaced it once (a refused fresh key is not old).
            self._settled = self.generation if not changed or self._unclear else None
            self.wanted = False
            return True

    def _failed(self, exc: BaseException) -> MCSyncError:
        error = translate(exc, self.url, self.bucket)
        if isinstance(error, Transient) and not isinstance(error, CredentialsExpired):
            return error  # the source is unreachable for now: worth another try
        # RuntimeError: botocore's "refreshed, but the refreshed credentials are still expired"
        detail = str(error) if error is not None else type(exc).__name__
        return AccessDenied(f"{self.url}: renewing expired keys failed ({detail[:300]})")


async def process_keys(command: str) -> Keys:
    """Keys from a ``credential_process`` (the AWS CLI's JSON: Version 1, AccessKeyId,
    SecretAccessKey, SessionToken, Expiration), run by botocore's own provider: with an
    Expiration they are refreshable credentials that run the command again to renew."""
    from aiobotocore.credentials import AioProcessProvider
    from botocore.exceptions import BotoCoreError

    config = {"profiles": {_PROCESS_PROFILE: {"credential_process": command}}}
    provider = AioProcessProvider(profile_name=_PROCESS_PROFILE, load_config=lambda: config)
    try:
        creds = await provider.load()
    except (BotoCoreError, OSError, ValueError) as exc:  # ValueError: output not JSON
        # The command line is not shown: it may carry a secret of its own.
        raise AccessDenied(f"credential_process failed: {type(exc).__name__}: "
                           f"{_first_line(exc)[:200]}") from None
    return await Keys.from_botocore(creds)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


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


def make_obstore(settings: ClientSettings, keys: Keys, *, preflight: bool = False) -> Any:
    """obstore's client for one bucket. ``preflight``: tried ``retry.preflight_attempts``
    times only, so a wrong address fails in seconds (``Store.check``)."""
    from obstore.store import S3Store as ObStore

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
