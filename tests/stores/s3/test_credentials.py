"""Keys that expire mid-run (moto behind the fault proxy): renewed before they expire, and
again when the endpoint refuses them (ExpiredToken), on the obstore and the botocore paths.

Keys come from a credential_process the test writes (a new key each call, a short
Expiration) or from a container-credentials server (the standard chain on s3://). moto takes
any key; the proxy refuses every key past the Expiration it was handed out with
(``PastExpiration``), or a named key from a moment on (``expire_key``), as AWS would. botocore
renews keys 15 (advisory) / 10 (mandatory) minutes before they expire; the tests shorten those
windows to seconds (``short_windows``) so keys live a few seconds and each is used many times.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import mcsync
from mcsync.errors import AccessDenied, CredentialsExpired
from mcsync.retry import RetryPolicy, retrying
from mcsync.stores.registry import StoreOptions, open_store
from mcsync.stores.s3 import S3Store
from testbed.faultproxy import (
    EXPIRED_TOKEN,
    INVALID_ACCESS_KEY,
    Exchange,
    FaultProxy,
    Rule,
    expire_key,
)
from testbed.servers import LOOPBACK, S3Endpoint

from ...integration.helpers import payload, read_bucket, write_tree

MiB = 1 << 20
SECRET = "s3cr3t-MARK"  # in every secret and token handed out: must appear in no output
TOKEN = "t0ken-MARK"

_SCRIPT = r'''
import fcntl, json, sys, time
from datetime import datetime, timezone
state, ttl, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
with open(state, "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    n = len(f.read().splitlines()) + 1
    key = "AKIDPROC000001" if mode == "same" else f"AKIDPROC{n:06d}"
    expires = time.time() + ttl
    f.write(f"{key} {expires}\n")
out = {"Version": 1, "AccessKeyId": key, "SecretAccessKey": f"{n}-SECRET",
       "SessionToken": f"{n}-TOKEN"}
if ttl > 0:
    out["Expiration"] = datetime.fromtimestamp(expires, timezone.utc).isoformat()
print(json.dumps(out))
'''.replace("SECRET", SECRET).replace("TOKEN", TOKEN)


@dataclass
class Issued:
    """The keys a credential source handed out: key → when it expires (epoch seconds)."""

    state: Path

    def keys(self) -> dict[str, float]:
        if not self.state.exists():
            return {}
        with self.state.open() as f:
            fcntl.flock(f, fcntl.LOCK_SH)
            lines = f.read().splitlines()
        return {k: float(t) for k, t in (line.split() for line in lines if line)}

    def count(self) -> int:
        return len(self.state.read_text().splitlines()) if self.state.exists() else 0


def process(tmp_path: Path, ttl: float, mode: str = "new") -> tuple[str, Issued]:
    """A credential_process command (``ttl`` 0: keys without Expiration) and its record."""
    script = tmp_path / "creds.py"
    script.write_text(_SCRIPT)
    state = tmp_path / f"issued-{mode}-{ttl}"
    return f"{sys.executable} {script} {state} {ttl} {mode}", Issued(state)


@dataclass
class PastExpiration(Rule):
    """Refuse (403 ExpiredToken) every key used past the Expiration it was handed out with."""

    issued: Issued | None = None

    def matches(self, req: Exchange, age: float) -> bool:
        expiry = self.issued.keys().get(req.access_key or "") if self.issued else None
        return expiry is not None and time.time() >= expiry and super().matches(req, age)


@dataclass
class EndsAfterFirstUse(Rule):
    """Refuse (403 ExpiredToken) every key ``seconds`` after the proxy first saw it, as AWS
    refuses a key whose session ended: whatever Expiration the key was handed out with."""

    seconds: float = 2.0
    first_use: dict[str, float] = field(default_factory=dict)

    def matches(self, req: Exchange, age: float) -> bool:
        if not req.access_key:
            return False
        first = self.first_use.setdefault(req.access_key, time.time())
        return time.time() - first > self.seconds and super().matches(req, age)


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` serving on 127.0.0.1 in a thread until the block ends; yields its URL."""
    server = ThreadingHTTPServer((LOOPBACK, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def keys_json(key: str, expires_in: float, **extra: str) -> bytes:
    """A credentials answer as the container and instance metadata endpoints give it."""
    expires = datetime.fromtimestamp(time.time() + expires_in, UTC)
    return json.dumps({**extra, "AccessKeyId": key, "SecretAccessKey": SECRET, "Token": TOKEN,
                       "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}).encode()


@pytest.fixture
def short_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore renews keys with under 1.5 s left (at the latest with 1 s left)."""
    from botocore.credentials import RefreshableCredentials

    monkeypatch.setattr(RefreshableCredentials, "_advisory_refresh_timeout", 1.5)
    monkeypatch.setattr(RefreshableCredentials, "_mandatory_refresh_timeout", 1.0)


def meta_process_env(monkeypatch: pytest.MonkeyPatch, ep: S3Endpoint, command: str) -> None:
    monkeypatch.setenv("MCSYNC_META_ENDPOINT_URL", ep.url)
    monkeypatch.setenv("MCSYNC_META_REGION", ep.region)
    monkeypatch.setenv("MCSYNC_META_CREDENTIAL_PROCESS", command)


def meta_store(monkeypatch: pytest.MonkeyPatch, proxy: FaultProxy, bucket: str,
               command: str) -> S3Store:
    meta_process_env(monkeypatch, proxy.endpoint, command)
    store = open_store(f"meta://{bucket}/p/", StoreOptions(retry=RetryPolicy(max_attempts=1)))
    assert isinstance(store, S3Store)
    return store


def used_keys(proxy: FaultProxy, op: str = "*") -> list[str]:
    """Access keys of the requests answered without a fault, in order of first use."""
    seen: dict[str, None] = {}
    for e in proxy.exchanges(op, fault=""):
        if e.access_key:
            seen.setdefault(e.access_key)
    return list(seen)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- renewed before they expire ------------------------------------------------------------------


def test_obstore_path_outlives_expiring_process_keys(moto, moto_proxy, bucket_factory,
                                                     monkeypatch, short_windows, tmp_path):
    """Keys living 2.5 s, requests for 6 s through obstore (PUT, GET, HEAD, LIST, DELETE): the
    keys are renewed before each expires and no request is refused."""
    bucket = bucket_factory(moto)
    command, issued = process(tmp_path, ttl=2.5)
    moto_proxy.add(PastExpiration(EXPIRED_TOKEN, issued=issued, name="past expiration"))
    store = meta_store(monkeypatch, moto_proxy, bucket, command)

    async def go() -> int:
        n, until = 0, time.monotonic() + 6
        while time.monotonic() < until:
            body = payload(1000 + n, n)
            await store.put(f"k{n}", body)
            assert bytes(await store.get(f"k{n}")) == body
            assert (await store.head(f"k{n}")).size == len(body)
            if n % 5 == 0:
                assert len([o async for o in store.list()]) == n + 1
            n += 1
            await asyncio.sleep(0.1)
        await store.delete("k0")
        await store.aclose()
        return n

    n = run(go())
    assert n > 10
    assert not moto_proxy.exchanges(fault="ExpiredToken")
    assert len(used_keys(moto_proxy, "PutObject")) >= 3
    assert set(used_keys(moto_proxy)) <= set(issued.keys())


def test_botocore_multipart_outlives_expiring_process_keys(moto, moto_proxy, bucket_factory,
                                                           monkeypatch, short_windows,
                                                           tmp_path):
    """One multipart upload whose parts go over 5 s, keys living 2 s: every part, the copy and
    the completion are signed with a live key."""
    bucket = bucket_factory(moto)
    command, issued = process(tmp_path, ttl=2.0)
    moto_proxy.add(PastExpiration(EXPIRED_TOKEN, issued=issued, name="past expiration"))
    store = meta_store(monkeypatch, moto_proxy, bucket, command)
    parts = [payload(5 * MiB, i) for i in range(6)]

    async def go() -> None:
        upload = await store.open_upload("big", sum(map(len, parts)))
        refs = []
        for i, part in enumerate(parts, 1):
            refs.append(await upload.put_part(i, 0, part))
            await asyncio.sleep(0.8)
        await upload.complete(refs)
        await store.copy_object(store.copy_source("big", None), "copy")
        await store.aclose()

    run(go())
    assert not moto_proxy.exchanges(fault="ExpiredToken")
    assert len(used_keys(moto_proxy, "UploadPart")) >= 3
    got = read_bucket(moto, bucket)
    assert got["p/big"] == got["p/copy"] == b"".join(parts)


# -- renewed when refused ------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["obstore", "botocore"])
def test_a_key_refused_as_expired_is_renewed_and_the_next_try_succeeds(
        path, moto, moto_proxy, bucket_factory, monkeypatch, tmp_path):
    """The endpoint ends a key long before its stated Expiration: the refused requests raise
    CredentialsExpired (a Transient), one renewal follows however many were refused at once,
    and the next try carries the new key."""
    bucket = bucket_factory(moto)
    command, issued = process(tmp_path, ttl=3600)
    store = meta_store(monkeypatch, moto_proxy, bucket, command)

    async def go() -> None:
        upload = await store.open_upload("mp", 5 * MiB) if path == "botocore" else None

        async def send(i: int) -> Any:
            if upload is not None:
                return await upload.put_part(i, 0, payload(5 * MiB, i))
            return await store.put(f"k{i}", b"x" * i)

        await send(1)
        first = next(iter(issued.keys()))
        moto_proxy.add(expire_key(first, after_s=0))
        results = await asyncio.gather(*(send(i) for i in range(2, 8)),
                                       return_exceptions=True)
        assert all(isinstance(r, CredentialsExpired) for r in results), results
        assert not any(first in str(r) or SECRET in str(r) for r in results)
        await send(8)
        # what the retry layer does: Transient errors tried again, each try fresh
        moto_proxy.add(expire_key(list(issued.keys())[-1], after_s=0))
        await retrying(lambda: send(9), RetryPolicy.immediate(3))
        if upload is not None:
            await upload.abort()
        await store.aclose()

    run(go())
    assert issued.count() == 3  # the first key, one renewal per expiry
    assert len(moto_proxy.exchanges(fault="ExpiredToken")) == 7


def test_invalid_access_key_is_expiry_when_a_renewal_replaces_it(moto, moto_proxy,
                                                                 bucket_factory, monkeypatch,
                                                                 tmp_path):
    bucket = bucket_factory(moto)
    command, issued = process(tmp_path, ttl=3600)
    store = meta_store(monkeypatch, moto_proxy, bucket, command)

    async def go() -> None:
        await store.put("a", b"a")
        moto_proxy.add(expire_key(next(iter(issued.keys())), 0, fault=INVALID_ACCESS_KEY))
        with pytest.raises(CredentialsExpired):
            await store.put("b", b"b")
        await store.put("b", b"b")  # the renewed key
        await store.aclose()

    run(go())
    assert issued.count() == 2


def test_invalid_access_key_that_a_renewal_keeps_is_denied(moto, moto_proxy, bucket_factory,
                                                           monkeypatch, tmp_path):
    """A source that renews to the same key, refused: one renewal to find out, then denied."""
    bucket = bucket_factory(moto)
    command, issued = process(tmp_path, ttl=3600, mode="same")
    moto_proxy.add(Rule(INVALID_ACCESS_KEY, op="PutObject"))
    store = meta_store(monkeypatch, moto_proxy, bucket, command)

    async def go() -> None:
        with pytest.raises(CredentialsExpired):
            await store.put("a", b"a")
        with pytest.raises(AccessDenied):
            await store.put("a", b"a")
        await store.aclose()

    run(go())
    assert issued.count() == 2


def test_a_fresh_key_refused_again_is_denied(moto, moto_proxy, bucket_factory, monkeypatch,
                                             tmp_path):
    """Every key refused as unknown (wrong account): one renewal, then AccessDenied, not a
    renewal per try."""
    bucket = bucket_factory(moto)
    command, issued = process(tmp_path, ttl=3600)
    moto_proxy.add(Rule(INVALID_ACCESS_KEY, op="HeadObject"))  # a HEAD: 403, no code
    store = meta_store(monkeypatch, moto_proxy, bucket, command)

    async def go() -> None:
        with pytest.raises(CredentialsExpired):
            await store.head("a")
        for _ in range(3):
            with pytest.raises(AccessDenied):
                await store.head("a")
        await store.aclose()

    run(go())
    assert issued.count() == 2


@pytest.mark.parametrize("fault", [EXPIRED_TOKEN, INVALID_ACCESS_KEY], ids=lambda f: f.code)
def test_fixed_keys_refused_are_denied(fault, moto, moto_proxy, bucket_factory, monkeypatch):
    """Fixed keys cannot be renewed: a refusal is a configuration error, never retried."""
    bucket = bucket_factory(moto)
    for k, v in moto_proxy.endpoint.meta_env().items():
        monkeypatch.setenv(k, v)
    moto_proxy.add(Rule(fault, op="PutObject"))
    store = open_store(f"meta://{bucket}/")

    async def go() -> None:
        with pytest.raises(AccessDenied) as info:
            await store.put("a", b"a")
        assert not isinstance(info.value, CredentialsExpired)
        await store.aclose()

    run(go())


def test_check_passes_expiry_on_as_transient(moto, moto_proxy, bucket_factory, monkeypatch,
                                            tmp_path):
    """``check`` makes configuration errors of its probe's failures, but not of expired keys:
    they are renewed, and the next try passes."""
    bucket = bucket_factory(moto)
    command, issued = process(tmp_path, ttl=3600)
    store = meta_store(monkeypatch, moto_proxy, bucket, command)
    moto_proxy.add(Rule(EXPIRED_TOKEN, op="ListObjectsV2", count=1))

    async def go() -> None:
        with pytest.raises(CredentialsExpired):
            await store.check(mode="target")
        await store.check(mode="target")
        await store.aclose()

    run(go())
    assert issued.count() == 2


# -- the standard chain on s3:// ----------------------------------------------------------------


@pytest.fixture
def container_credentials(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A container-credentials endpoint (ECS / EKS Pod Identity) on 127.0.0.1: a new key each
    call, valid 2 s; the chain finds it through AWS_CONTAINER_CREDENTIALS_FULL_URI."""
    issued: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            issued.append(f"AKIDCONT{len(issued) + 1:06d}")
            body = keys_json(issued[-1], 2.0)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"{url}/creds")
        yield issued


def test_s3_chain_container_keys_are_renewed_on_both_paths(moto, moto_proxy, bucket_factory,
                                                           monkeypatch, short_windows,
                                                           container_credentials):
    """s3:// with keys from the standard chain (container metadata, 2-second keys): obstore
    (PUT) and botocore (UploadPart) both go on past several expiries."""
    bucket = bucket_factory(moto)
    moto_proxy.add(EndsAfterFirstUse(EXPIRED_TOKEN, seconds=2.0))
    monkeypatch.setenv("AWS_REGION", moto.region)
    store = open_store(f"s3://{bucket}/", StoreOptions(endpoint_url=moto_proxy.url,
                                                      retry=RetryPolicy(max_attempts=1)))
    assert isinstance(store, S3Store)

    async def go() -> None:
        upload = await store.open_upload("mp", 10 * MiB)
        refs, until, n = [], time.monotonic() + 5, 0
        while time.monotonic() < until:
            n += 1
            await store.put(f"k{n}", b"x" * n)
            if n % 8 == 0 and len(refs) < 6:
                refs.append(await upload.put_part(len(refs) + 1, 0, payload(5 * MiB, n)))
            await asyncio.sleep(0.1)
        await upload.complete(refs)
        await store.aclose()

    run(go())
    assert not moto_proxy.exchanges(fault="ExpiredToken")
    assert len(used_keys(moto_proxy, "PutObject")) >= 2
    assert len(used_keys(moto_proxy, "UploadPart")) >= 2
    assert set(used_keys(moto_proxy)) <= set(container_credentials)


def _chain_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str = "") -> None:
    """No keys in the environment or the host's files: the chain must find its own."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_ROLE_ARN",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_EC2_METADATA_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "aws-config"
    path.write_text(config)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(path))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))


def _keys_renewed_after(monkeypatch: pytest.MonkeyPatch, seconds: float,
                        lifetime: float = 3600) -> None:
    """Keys valid ``lifetime`` seconds (STS, as moto answers: a new key a call, an hour)
    renewed by botocore ``seconds`` after they were issued: its refresh windows and the cache
    of its STS fetchers both shortened."""
    from botocore.credentials import CachedCredentialFetcher, RefreshableCredentials

    monkeypatch.setattr(RefreshableCredentials, "_advisory_refresh_timeout", lifetime - seconds)
    monkeypatch.setattr(RefreshableCredentials, "_mandatory_refresh_timeout",
                        lifetime - seconds - 0.5)
    monkeypatch.setattr(CachedCredentialFetcher, "DEFAULT_EXPIRY_WINDOW_SECONDS",
                        lifetime - seconds)


@pytest.fixture
def web_identity(tmp_path: Path, moto: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """IRSA / web identity: a token file exchanged at STS (AssumeRoleWithWebIdentity)."""
    _chain_only(tmp_path, monkeypatch)
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.e30.c2lnbmF0dXJl")  # moto checks no signature
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/mcsync-test")
    monkeypatch.setenv("AWS_ROLE_SESSION_NAME", "mcsync-test")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", moto.url)
    _keys_renewed_after(monkeypatch, 1.5)


@pytest.fixture
def assume_role(tmp_path: Path, moto: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile that assumes a role (role_arn + source_profile) through STS AssumeRole."""
    _chain_only(tmp_path, monkeypatch, config=(
        "[profile base]\naws_access_key_id = AKIDBASE0000001\n"
        f"aws_secret_access_key = {SECRET}\n"
        "[profile mcsync]\nrole_arn = arn:aws:iam::123456789012:role/mcsync-test\n"
        "source_profile = base\n"))
    monkeypatch.setenv("AWS_PROFILE", "mcsync")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", moto.url)
    _keys_renewed_after(monkeypatch, 1.5)


@pytest.fixture
def instance_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """EC2 instance metadata (IMDSv2: a session token, then the role's keys) on 127.0.0.1, a
    new key each call, valid 6 hours and renewed by botocore 1.5 s after it was issued.
    (botocore stretches a key that expires within ~20 minutes to 12-20 minutes from now
    rather than trust a metadata service that may be failing, so a short key is no test.)"""
    _chain_only(tmp_path, monkeypatch)
    _keys_renewed_after(monkeypatch, 1.5, lifetime=6 * 3600)
    issued: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _send(self, body: bytes, status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self) -> None:
            self._send(b"imds-session-token" if self.path == "/latest/api/token" else b"", 200
                       if self.path == "/latest/api/token" else 404)

        def do_GET(self) -> None:
            base = "/latest/meta-data/iam/security-credentials/"
            if self.headers.get("X-aws-ec2-metadata-token") != "imds-session-token":
                self._send(b"", 401)
            elif self.path == base:
                self._send(b"mcsync-role")
            elif self.path == base + "mcsync-role":
                issued.append(f"AKIDIMDS{len(issued) + 1:06d}")
                self._send(keys_json(issued[-1], 6 * 3600, Code="Success", Type="AWS-HMAC"))
            else:
                self._send(b"", 404)

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", f"{url}/")
        yield


@pytest.mark.parametrize("source", ["web_identity", "assume_role", "instance_metadata"])
def test_sync_with_chain_keys_the_endpoint_ends_every_2_s(
        source, request, moto, moto_proxy, bucket_factory, monkeypatch, tmp_path, caplog):
    """s3:// with keys from the standard chain — a web identity token (IRSA on EKS), a
    profile that assumes a role, instance metadata — each key refused 2 s after its first use:
    botocore renews STS keys before then (UploadPart); a key refused (obstore's PUTs, which
    keep a key until it is) is renewed and the request tried again. Byte for byte, and no
    secret in the log."""
    request.getfixturevalue(source)
    monkeypatch.setenv("AWS_REGION", moto.region)
    bucket = bucket_factory(moto)
    moto_proxy.add(EndsAfterFirstUse(EXPIRED_TOKEN, seconds=2.0, name="2 s keys"))
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_proxy.url)  # STS and metadata: not proxied
    root, objects = _tree(tmp_path)
    caplog.set_level(logging.DEBUG, logger="mcsync")

    # 4 MiB/s (a burst of 4 MiB): the 20 MiB object's parts are sent over ~4 s, well past the
    # 1.5 s after which botocore renews a key, wherever in the run the key was issued. At
    # 8 MiB/s they took ~1.5 s, a margin of none: the web identity case then saw one key on
    # every UploadPart in 6 runs of 6 one evening (on the code of the day before too).
    report = mcsync.sync(str(root), f"s3://{bucket}/run/", part_size=5 * MiB, concurrency=4,
                         bw_limit="4MiB")
    assert report.ok
    assert read_bucket(moto, bucket, "run/") == objects
    assert len(used_keys(moto_proxy, "UploadPart")) >= 2
    assert len(used_keys(moto_proxy, "PutObject")) >= 2
    prefix = "AKIDIMDS" if source == "instance_metadata" else "ASIA"  # the source's, no other
    assert all(k.startswith(prefix) for k in used_keys(moto_proxy))
    assert report.requests_credentials_expired <= len(moto_proxy.exchanges(fault="ExpiredToken"))
    assert SECRET not in caplog.text and TOKEN not in caplog.text


# -- through mcsync.sync, and what reaches output ------------------------------------------------


def _tree(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    objects = {f"d/f{i:03d}.bin": payload(20_000 + i, i) for i in range(40)}
    objects["big.bin"] = payload(20 * MiB, 99)
    root = tmp_path / "src"
    write_tree(root, objects)
    return root, objects


def test_sync_with_expiring_process_keys_and_no_credentials_in_output(
        moto, moto_proxy, bucket_factory, monkeypatch, short_windows, tmp_path, caplog, capfd):
    """A whole sync (small objects through obstore, a multipart object through botocore) with
    keys living 2 s: byte-for-byte, and neither a secret nor a token in the logs (mcsync's at
    DEBUG, everyone's at INFO), the report, errors or reprs."""
    bucket = bucket_factory(moto)
    command, issued = process(tmp_path, ttl=2.0)
    moto_proxy.add(PastExpiration(EXPIRED_TOKEN, issued=issued, name="past expiration"))
    meta_process_env(monkeypatch, moto_proxy.endpoint, command)
    root, objects = _tree(tmp_path)
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="mcsync")

    report = mcsync.sync(str(root), f"meta://{bucket}/run/", part_size=5 * MiB,
                         concurrency=4, bw_limit="8MiB")
    assert report.ok
    assert read_bucket(moto, bucket, "run/") == objects
    store = open_store(f"meta://{bucket}/")
    shown = [caplog.text, repr(report), json.dumps(report.to_dict(), default=str),
             repr(store), *capfd.readouterr()]
    assert issued.count() >= 2
    for text in shown:
        assert SECRET not in text and TOKEN not in text


def test_sync_through_a_key_the_endpoint_ends_early(moto, moto_proxy, bucket_factory,
                                                   monkeypatch, tmp_path, caplog):
    """The endpoint ends the first key mid-run (ExpiredToken, its Expiration an hour away):
    the refused requests are tried again with a renewed key and the run succeeds, with no
    failure reported and no credential in the output."""
    bucket = bucket_factory(moto)
    command, issued = process(tmp_path, ttl=3600)
    meta_process_env(monkeypatch, moto_proxy.endpoint, command)
    root, objects = _tree(tmp_path)
    moto_proxy.add(Rule(EXPIRED_TOKEN, op={"PutObject", "UploadPart"}, after_s=0,
                        name="first key ends", access_key="AKIDPROC000001"))
    caplog.set_level(logging.DEBUG, logger="mcsync")

    report = mcsync.sync(str(root), f"meta://{bucket}/run/", part_size=5 * MiB, concurrency=4)
    assert report.ok
    assert read_bucket(moto, bucket, "run/") == objects
    refused = moto_proxy.exchanges(fault="ExpiredToken")
    assert refused and issued.count() >= 2
    assert 1 <= report.requests_credentials_expired <= len(refused)  # shown in the report
    assert SECRET not in caplog.text and TOKEN not in caplog.text


def test_verbose_cli_output_holds_no_credentials(moto, bucket_factory, tmp_path):
    """``mcsync -v`` logs at DEBUG; botocore would log each request's headers (the access key,
    the session token) at that level, so the SDKs' loggers are kept at INFO."""
    import os
    import subprocess

    bucket = bucket_factory(moto)
    root, objects = _tree(tmp_path)
    env = dict(os.environ) | moto.meta_env() | {
        "MCSYNC_META_SECRET_ACCESS_KEY": f"x-{SECRET}", "MCSYNC_META_SESSION_TOKEN": TOKEN}
    result = subprocess.run(
        [sys.executable, "-m", "mcsync.cli.main", "sync", str(root), f"meta://{bucket}/v/",
         "--part-size", "5MiB", "-v", "--json"], env=env, capture_output=True, text=True,
        check=False, cwd=Path(__file__).parents[3])
    assert result.returncode == 0, result.stderr[-2000:]
    assert read_bucket(moto, bucket, "v/") == objects
    for text in (result.stdout, result.stderr):
        assert SECRET not in text and TOKEN not in text
