"""The keys an S3 store signs with.

Keys are ``Keys``: fixed ones, or botocore's credentials object when its source can refresh
(assume-role, web identity, credential_process, container and instance metadata, SSO). Both
clients use that one object: botocore signs with it, and obstore's (async) credential provider
hands out its current keys with their expiry, so obstore asks again shortly before they expire
and botocore's own refresh machinery renews them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..errors import AccessDenied, CredentialsExpired, MCSyncError, Transient
from .s3_errors import answer_of, translate, unclear_refusal

if TYPE_CHECKING:
    pass
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

