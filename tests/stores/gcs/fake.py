"""A small fake of the GCS JSON API and Google's token endpoints, for what the emulator cannot
show: listings that page (``maxResults`` / ``pageToken``), injected 4xx / 5xx answers, a server
that ignores ``Range``, and authentication (OAuth token endpoint, metadata server, bearer
tokens checked on every request).

It runs an aiohttp server on 127.0.0.1 in a thread of its own and records every request.
Only what ``GCSStore`` uses is implemented, following the JSON API reference.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import jwt
from aiohttp import web

from mcsync import checksums
from testbed.servers import LOOPBACK, free_port


@dataclass
class FakeObject:
    data: bytes
    generation: int
    updated: str = "2026-01-02T03:04:05.678Z"
    crc32c: str | None = None  # None: the true CRC32C
    md5: bool = True  # False: a composite object (GCS keeps no MD5 for those)


@dataclass
class Seen:
    method: str
    path: str  # raw, still percent-encoded
    query: dict[str, str]
    headers: dict[str, str]


@dataclass
class FakeGCS:
    bucket: str = "fake-bucket"
    objects: dict[str, FakeObject] = field(default_factory=dict)
    failures: list[int] = field(default_factory=list)  # statuses answered before anything else
    ignore_range: bool = False
    misorder: bool = False
    access_token: str | None = None  # when set, every GCS request must carry it
    token_status: int = 200  # answer of the token endpoints
    public_key: Any = None  # a service account's key: JWT assertions are verified with it
    requests: list[Seen] = field(default_factory=list)
    url: str = ""
    _generation: int = 1000

    def put(self, name: str, data: bytes, **kw: Any) -> FakeObject:
        self._generation += 1
        obj = self.objects[name] = FakeObject(data, self._generation, **kw)
        return obj

    def gcs_requests(self) -> list[Seen]:
        return [r for r in self.requests if r.path.startswith("/storage/")]

    # -- handlers -----------------------------------------------------------------------------

    def _resource(self, name: str, obj: FakeObject) -> dict[str, Any]:
        crc = obj.crc32c or checksums.to_base64(checksums.crc32c(obj.data))
        res = {"name": name, "bucket": self.bucket, "size": str(len(obj.data)),
               "generation": str(obj.generation), "updated": obj.updated, "crc32c": crc,
               "etag": "CKih16GjycICEAE="}
        if obj.md5:
            res["md5Hash"] = base64.b64encode(hashlib.md5(obj.data).digest()).decode()
        return res

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(Seen(request.method, request.raw_path.split("?")[0],
                                  dict(request.query), dict(request.headers)))
        path = request.raw_path.split("?")[0]
        if path == "/token":
            return await self._token(request)
        if path.startswith("/computeMetadata/"):
            if request.headers.get("Metadata-Flavor") != "Google":
                return web.json_response({"error": "no flavor"}, status=403)
            return await self._token(request)
        if self.failures:
            status = self.failures.pop(0)
            return web.json_response({"error": {"code": status, "message": f"injected {status}"}},
                                     status=status)
        if self.access_token is not None and (
                request.headers.get("Authorization") != f"Bearer {self.access_token}"):
            return web.json_response({"error": {"code": 401, "message": "Invalid Credentials"}},
                                     status=401)
        prefix = f"/storage/v1/b/{self.bucket}/o"
        if not path.startswith(f"/storage/v1/b/{self.bucket}/"):
            return web.json_response({"error": {"code": 404, "message": "no such bucket"}},
                                     status=404)
        if path == prefix:
            return self._list(request)
        name = unquote(path[len(prefix) + 1:])
        obj = self.objects.get(name)
        if obj is None:
            return web.json_response({"error": {"code": 404, "message": "No such object"}},
                                     status=404)
        want = request.query.get("ifGenerationMatch")
        if want is not None and want != str(obj.generation):
            return web.json_response({"error": {"code": 412, "message": "conditionNotMet"}},
                                     status=412)
        if request.query.get("alt") != "media":
            return web.json_response(self._resource(name, obj))
        headers = {"x-goog-generation": str(obj.generation)}
        rng = request.headers.get("Range")
        if rng and not self.ignore_range:
            start_s, _, end_s = rng.removeprefix("bytes=").partition("-")
            start, end = int(start_s), min(int(end_s) + 1, len(obj.data))
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(obj.data)}"
            return web.Response(body=obj.data[start:end], status=206, headers=headers)
        res = self._resource(name, obj)
        headers["x-goog-hash"] = f"crc32c={res['crc32c']},md5={res.get('md5Hash', '')}"
        return web.Response(body=obj.data, headers=headers)

    def _list(self, request: web.Request) -> web.Response:
        prefix = request.query.get("prefix", "")
        size = int(request.query.get("maxResults", "1000"))
        after = request.query.get("pageToken")
        after = base64.urlsafe_b64decode(after).decode() if after else None
        names = sorted(n for n in self.objects if n.startswith(prefix)
                       and (after is None or n > after))
        if self.misorder and len(names) > 1:
            names[0], names[1] = names[1], names[0]
        page = names[:size]
        body: dict[str, Any] = {"kind": "storage#objects",
                                "items": [self._resource(n, self.objects[n]) for n in page]}
        if len(names) > size:
            body["nextPageToken"] = base64.urlsafe_b64encode(page[-1].encode()).decode()
        return web.json_response(body)

    async def _token(self, request: web.Request) -> web.Response:
        if self.token_status != 200:
            return web.json_response({"error": "invalid_grant",
                                      "error_description": "Invalid JWT Signature."},
                                     status=self.token_status)
        if request.method == "POST":
            form = await request.post()
            if form.get("grant_type") == "urn:ietf:params:oauth:grant-type:jwt-bearer":
                claims = jwt.decode(str(form["assertion"]), self.public_key, algorithms=["RS256"],
                                    audience=f"{self.url}/token")
                assert "devstorage.read_only" in claims["scope"]
            elif form.get("grant_type") != "refresh_token":
                return web.json_response({"error": "unsupported_grant_type"}, status=400)
        return web.json_response({"access_token": self.access_token or "token",
                                  "expires_in": 3600, "token_type": "Bearer"})


class FakeServer:
    """Runs a FakeGCS on 127.0.0.1 in a thread; ``with FakeServer(fake) as url: ...``."""

    def __init__(self, fake: FakeGCS) -> None:
        self.fake = fake
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def __enter__(self) -> str:
        self._thread.start()
        port = free_port()
        self.fake.url = f"http://{LOOPBACK}:{port}"

        async def start() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self.fake.handle)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, LOOPBACK, port).start()

        asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        return self.fake.url

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
