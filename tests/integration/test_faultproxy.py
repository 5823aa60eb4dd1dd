"""The fault-injecting proxy itself (``testbed.faultproxy``), observed with plain botocore
clients with retries off: each fault does what it says, to the requests its rule names and no
others, and the record says what happened."""

from __future__ import annotations

import http.client
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    ReadTimeoutError,
    ResponseStreamingError,
)

from testbed.faultproxy import (
    EXPIRED_TOKEN,
    INTERNAL_ERROR,
    INVALID_ACCESS_KEY,
    SLOW_DOWN,
    TOO_MANY_REQUESTS,
    Corrupt,
    FaultProxy,
    Reply,
    Reset,
    Rule,
    ShortBody,
    Stall,
    expire_key,
    s3_operation,
)
from testbed.servers import S3Endpoint

from .helpers import payload

MiB = 1 << 20
CONNECTION_LOST = (ConnectionClosedError, EndpointConnectionError)


def plain(ep: S3Endpoint, **config: Any) -> Any:
    """A botocore client that tries every request once."""
    return ep.client(retries={"total_max_attempts": 1}, **config)


def code(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


@pytest.mark.parametrize(("method", "target", "headers", "op", "key"), [
    ("GET", "/", {}, "ListBuckets", ""),
    ("GET", "/b?list-type=2&prefix=x%2F", {}, "ListObjectsV2", ""),
    ("GET", "/b/?list-type=2", {}, "ListObjectsV2", ""),
    ("GET", "/b?uploads&prefix=a", {}, "ListMultipartUploads", ""),
    ("GET", "/b", {}, "ListObjects", ""),
    ("PUT", "/b", {}, "CreateBucket", ""),
    ("HEAD", "/b", {}, "HeadBucket", ""),
    ("POST", "/b?delete", {}, "DeleteObjects", ""),
    ("GET", "/b/a/k%20%C3%A9.bin", {}, "GetObject", "a/k é.bin"),
    ("HEAD", "/b/k", {}, "HeadObject", "k"),
    ("PUT", "/b/k", {}, "PutObject", "k"),
    ("PUT", "/b/k", {"x-amz-copy-source": "b/j"}, "CopyObject", "k"),
    ("POST", "/b/k?uploads", {}, "CreateMultipartUpload", "k"),
    ("PUT", "/b/k?partNumber=2&uploadId=U", {}, "UploadPart", "k"),
    ("PUT", "/b/k?partNumber=2&uploadId=U", {"x-amz-copy-source": "b/j"}, "UploadPartCopy", "k"),
    ("GET", "/b/k?uploadId=U", {}, "ListParts", "k"),
    ("POST", "/b/k?uploadId=U", {}, "CompleteMultipartUpload", "k"),
    ("DELETE", "/b/k?uploadId=U", {}, "AbortMultipartUpload", "k"),
    ("DELETE", "/b/k", {}, "DeleteObject", "k"),
])
def test_operations_are_named_from_method_path_and_query(method, target, headers, op, key):
    from urllib.parse import parse_qsl, urlsplit

    parts = urlsplit(target)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    assert s3_operation(method, parts.path, query, headers) == (op, "b" if target != "/" else "",
                                                                 key)


def test_requests_go_through_unchanged_and_are_recorded(seaweed, seaweed_proxy, bucket_factory):
    """SeaweedFS checks every signature: each operation mcsync uses, through the proxy, on one
    kept-alive connection, with the bytes intact both ways."""
    bucket = bucket_factory(seaweed)
    c = plain(seaweed_proxy.endpoint)
    body = payload(6 * MiB + 7, 1)
    c.put_object(Bucket=bucket, Key="dir/ü b+c.bin", Body=body)
    assert c.get_object(Bucket=bucket, Key="dir/ü b+c.bin")["Body"].read() == body
    assert c.head_object(Bucket=bucket, Key="dir/ü b+c.bin")["ContentLength"] == len(body)
    c.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "dir/ü b+c.bin"})
    uid = c.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    e1 = c.upload_part(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=1, Body=body)["ETag"]
    e2 = c.upload_part_copy(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=2,
                            CopySource={"Bucket": bucket, "Key": "copy"},
                            CopySourceRange="bytes=0-99")["CopyPartResult"]["ETag"]
    assert len(c.list_parts(Bucket=bucket, Key="mp", UploadId=uid)["Parts"]) == 2
    assert len(c.list_multipart_uploads(Bucket=bucket)["Uploads"]) == 1
    c.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=uid, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    other = c.create_multipart_upload(Bucket=bucket, Key="gone")["UploadId"]
    c.abort_multipart_upload(Bucket=bucket, Key="gone", UploadId=other)
    assert [o["Key"] for o in c.list_objects_v2(Bucket=bucket)["Contents"]] == [
        "copy", "dir/ü b+c.bin", "mp"]
    c.delete_object(Bucket=bucket, Key="copy")
    assert seaweed.client().get_object(Bucket=bucket, Key="mp")["Body"].read() == body + body[:100]

    log = seaweed_proxy.exchanges()
    assert [(e.op, e.key) for e in log] == [
        ("PutObject", "dir/ü b+c.bin"), ("GetObject", "dir/ü b+c.bin"),
        ("HeadObject", "dir/ü b+c.bin"), ("CopyObject", "copy"), ("CreateMultipartUpload", "mp"),
        ("UploadPart", "mp"), ("UploadPartCopy", "mp"), ("ListParts", "mp"),
        ("ListMultipartUploads", ""), ("CompleteMultipartUpload", "mp"),
        ("CreateMultipartUpload", "gone"), ("AbortMultipartUpload", "gone"),
        ("ListObjectsV2", ""), ("DeleteObject", "copy")]
    assert {(e.bucket, e.access_key, e.fault, e.outcome) for e in log} == {
        (bucket, seaweed.access_key, None, "ok")}
    assert all(200 <= (e.status or 0) < 300 for e in log)
    assert {e.conn for e in log} == {1}  # kept alive
    assert log[5].part == "1" and log[6].part == "2"


@pytest.mark.parametrize("fault", [SLOW_DOWN, INTERNAL_ERROR, TOO_MANY_REQUESTS],
                         ids=lambda f: f.code)
@pytest.mark.parametrize("server", ["seaweed", "moto"])
def test_an_error_rule_with_a_count_fails_exactly_that_many_requests(request, server, fault,
                                                                     bucket_factory):
    ep: S3Endpoint = request.getfixturevalue(server)
    proxy: FaultProxy = request.getfixturevalue(f"{server}_proxy")
    bucket = bucket_factory(ep)
    rule = proxy.add(Rule(fault, op="PutObject", count=2))
    c = plain(proxy.endpoint)
    for attempt in (1, 2):
        with pytest.raises(ClientError) as caught:
            c.put_object(Bucket=bucket, Key="k", Body=f"attempt {attempt}".encode())
        assert code(caught.value) == (fault.status, fault.code)
        assert caught.value.response["Error"]["Message"] == fault.message
        c.head_bucket(Bucket=bucket)  # other operations pass
    c.put_object(Bucket=bucket, Key="k", Body=b"attempt 3")
    assert ep.client().get_object(Bucket=bucket, Key="k")["Body"].read() == b"attempt 3"
    assert rule.applied == 2
    puts = proxy.exchanges("PutObject")
    assert [(e.fault, e.status) for e in puts] == [(fault.code, fault.status)] * 2 + [(None, 200)]
    log = proxy.exchanges()  # an error answer keeps the connection: the next request takes it
    assert all(log[i + 1].conn == e.conn for i, e in enumerate(log) if e.fault)


def test_an_error_answer_is_an_s3_error_document(seaweed, seaweed_proxy):
    """Status, a Content-Length that is the body's, and S3's XML; a HEAD gets no body; the
    request's body is read first, so the connection goes on."""
    seaweed_proxy.add(Rule(Reply(503, "SlowDown", "Please & reduce <now>")))
    host, port = seaweed_proxy.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    for method in ("PUT", "HEAD", "GET"):
        conn.request(method, "/b/some%20key", body=b"x" * 100_000 if method == "PUT" else None)
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 503 and resp.reason == "Service Unavailable"
        assert resp.getheader("Content-Type") == "application/xml"
        assert int(resp.getheader("Content-Length")) == len(body)
        if method == "HEAD":
            assert body == b""
            continue
        doc = ET.fromstring(body)
        assert (doc.tag, doc.findtext("Code"), doc.findtext("Message"),
                doc.findtext("Resource")) == ("Error", "SlowDown", "Please & reduce <now>",
                                              "/b/some%20key")
        assert doc.findtext("RequestId") == resp.getheader("x-amz-request-id")
    conn.close()
    assert [e.conn for e in seaweed_proxy.exchanges()] == [1, 1, 1]


def test_an_error_answer_to_a_head_keeps_the_connection(seaweed, seaweed_proxy, bucket_factory):
    bucket = bucket_factory(seaweed)
    seaweed.client().put_object(Bucket=bucket, Key="k", Body=b"data")
    seaweed_proxy.add(Rule(SLOW_DOWN, op="HeadObject", count=1))
    c = plain(seaweed_proxy.endpoint)
    with pytest.raises(ClientError) as caught:
        c.head_object(Bucket=bucket, Key="k")
    assert code(caught.value)[0] == 503
    assert c.head_object(Bucket=bucket, Key="k")["ContentLength"] == 4
    assert [e.conn for e in seaweed_proxy.exchanges()] == [1, 1]


def test_rules_match_operations_keys_and_headers(seaweed, seaweed_proxy, bucket_factory):
    bucket = bucket_factory(seaweed)
    proxy = seaweed_proxy
    proxy.add(Rule(INTERNAL_ERROR, op={"PutObject", "UploadPart"}, key="data/*", name="data"))
    proxy.add(Rule(SLOW_DOWN, op="Upload*", header="Content-MD5", name="md5"))
    c = plain(proxy.endpoint)
    c.put_object(Bucket=bucket, Key="other/x", Body=b"1")
    with pytest.raises(ClientError, match="InternalError"):
        c.put_object(Bucket=bucket, Key="data/x", Body=b"1")
    uid = c.create_multipart_upload(Bucket=bucket, Key="data/mp")["UploadId"]
    with pytest.raises(ClientError, match="InternalError"):
        c.upload_part(Bucket=bucket, Key="data/mp", UploadId=uid, PartNumber=1, Body=b"1")
    other = c.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    c.upload_part(Bucket=bucket, Key="mp", UploadId=other, PartNumber=1, Body=b"1")
    with pytest.raises(ClientError, match="SlowDown"):
        c.upload_part(Bucket=bucket, Key="mp", UploadId=other, PartNumber=2, Body=b"1",
                      ContentMD5="xMpCOKC5I4INzFCab3WEmw==")
    assert [(e.op, e.rule) for e in proxy.exchanges() if e.fault] == [
        ("PutObject", "data"), ("UploadPart", "data"), ("UploadPart", "md5")]


@pytest.mark.parametrize("at", ["before", "request"])
def test_a_reset_before_or_inside_the_request_body_is_a_connection_error(
        at, seaweed, seaweed_proxy, bucket_factory):
    bucket = bucket_factory(seaweed)
    seaweed_proxy.add(Rule(Reset(at), op="PutObject", count=1))
    c = plain(seaweed_proxy.endpoint)
    with pytest.raises(CONNECTION_LOST):
        c.put_object(Bucket=bucket, Key="k", Body=payload(4 * MiB, 2))
    assert "Contents" not in seaweed.client().list_objects_v2(Bucket=bucket)  # nothing stored
    c.put_object(Bucket=bucket, Key="k", Body=b"again")  # on a new connection
    [reset, again] = seaweed_proxy.exchanges()
    assert (reset.fault, reset.status, reset.outcome) == (f"reset-{at}", None, "reset")
    assert (again.fault, again.outcome, again.conn) == (None, "ok", reset.conn + 1)


def test_a_reset_inside_the_response_body_is_a_connection_error(seaweed, seaweed_proxy,
                                                                bucket_factory):
    bucket = bucket_factory(seaweed)
    data = payload(4 * MiB, 3)
    seaweed.client().put_object(Bucket=bucket, Key="k", Body=data)
    seaweed_proxy.add(Rule(Reset("response", fraction=0.5), op="GetObject", count=1))
    c = plain(seaweed_proxy.endpoint)
    resp = c.get_object(Bucket=bucket, Key="k")  # the head came whole
    assert resp["ContentLength"] == len(data)
    with pytest.raises(ResponseStreamingError, match="Connection reset by peer"):
        resp["Body"].read()
    assert c.get_object(Bucket=bucket, Key="k")["Body"].read() == data
    assert [(e.fault, e.status, e.outcome) for e in seaweed_proxy.exchanges()] == [
        ("reset-response", 200, "reset"), (None, 200, "ok")]


def test_a_short_body_is_an_incomplete_read(seaweed, seaweed_proxy, bucket_factory):
    bucket = bucket_factory(seaweed)
    data = payload(4 * MiB, 4)
    seaweed.client().put_object(Bucket=bucket, Key="k", Body=data)
    seaweed_proxy.add(Rule(ShortBody(0.25), op="GetObject", count=1))
    c = plain(seaweed_proxy.endpoint)
    body = c.get_object(Bucket=bucket, Key="k")["Body"]
    with pytest.raises(ResponseStreamingError,
                       match=rf"IncompleteRead\({MiB} bytes read, {3 * MiB} more expected\)"):
        body.read()
    assert c.get_object(Bucket=bucket, Key="k")["Body"].read() == data
    assert seaweed_proxy.exchanges()[0].outcome == "short"


def test_a_stall_past_the_client_timeout_is_a_read_timeout(seaweed, seaweed_proxy,
                                                           bucket_factory):
    """The request was served upstream: the client only never heard."""
    bucket = bucket_factory(seaweed)
    seaweed_proxy.add(Rule(Stall(30), op="PutObject", count=1))
    c = plain(seaweed_proxy.endpoint, read_timeout=1)
    start = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        c.put_object(Bucket=bucket, Key="k", Body=b"stored anyway")
    assert 1 <= time.monotonic() - start < 5
    assert seaweed.client().get_object(Bucket=bucket, Key="k")["Body"].read() == b"stored anyway"
    deadline = time.monotonic() + 5  # the proxy sees the client leave within 50 ms
    while seaweed_proxy.exchanges()[0].outcome == "pending" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seaweed_proxy.exchanges()[0].outcome == "client-gone"


def test_a_stall_within_the_client_timeout_only_delays(seaweed, seaweed_proxy, bucket_factory):
    bucket = bucket_factory(seaweed)
    seaweed_proxy.add(Rule(Stall(0.5), op="HeadBucket"))
    c = plain(seaweed_proxy.endpoint, read_timeout=5)
    start = time.monotonic()
    c.head_bucket(Bucket=bucket)
    assert time.monotonic() - start >= 0.5
    assert seaweed_proxy.exchanges()[0].outcome == "ok"


@pytest.mark.parametrize("fault", [EXPIRED_TOKEN, INVALID_ACCESS_KEY], ids=lambda f: f.code)
def test_a_key_expires_at_its_deadline_and_only_that_key(fault, moto, moto_proxy,
                                                         bucket_factory):
    """moto takes any keys: two clients, two keys, one proxy."""
    bucket = bucket_factory(moto)
    deadline = moto_proxy.elapsed() + 1.0
    moto_proxy.add(expire_key("AKIDEXPIRING", after_s=deadline, fault=fault))
    expiring = plain(S3Endpoint(moto_proxy.url, "AKIDEXPIRING", "secret-1"))
    lasting = plain(S3Endpoint(moto_proxy.url, "AKIDLASTING", "secret-2"))
    expiring.put_object(Bucket=bucket, Key="a", Body=b"before")
    lasting.put_object(Bucket=bucket, Key="b", Body=b"before")
    time.sleep(max(0.0, deadline + 0.05 - moto_proxy.elapsed()))
    for call in (lambda: expiring.put_object(Bucket=bucket, Key="a", Body=b"after"),
                 lambda: expiring.list_objects_v2(Bucket=bucket)):
        with pytest.raises(ClientError) as caught:
            call()
        assert code(caught.value) == (403, fault.code)
    lasting.put_object(Bucket=bucket, Key="b", Body=b"after")
    assert moto.client().get_object(Bucket=bucket, Key="a")["Body"].read() == b"before"
    assert [(e.access_key, e.fault) for e in moto_proxy.exchanges()] == [
        ("AKIDEXPIRING", None), ("AKIDLASTING", None), ("AKIDEXPIRING", fault.code),
        ("AKIDEXPIRING", fault.code), ("AKIDLASTING", None)]


def _failed_keys(ep: S3Endpoint, bucket: str, seed: int, threads: int) -> set[str]:
    with FaultProxy(ep, [Rule(SLOW_DOWN, op="PutObject", probability=0.3)],
                    seed=seed).running() as proxy:
        c = plain(proxy.endpoint, max_pool_connections=threads)

        def put(i: int) -> None:
            for _ in range(2):  # a second try of each key: its own draw
                try:
                    c.put_object(Bucket=bucket, Key=f"k{i:02d}", Body=b"x")
                except ClientError:
                    continue

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(put, range(40)))
        return {f"{e.key}#{n}" for n, e in _numbered(proxy.exchanges()) if e.fault}


def _numbered(log: list[Any]) -> list[tuple[int, Any]]:
    seen: dict[str, int] = {}
    out = []
    for e in sorted(log, key=lambda e: e.seq):
        seen[e.key] = seen.get(e.key, 0) + 1
        out.append((seen[e.key], e))
    return out


def test_probabilities_repeat_with_the_seed_however_requests_interleave(seaweed,
                                                                        bucket_factory):
    bucket = bucket_factory(seaweed)
    first = _failed_keys(seaweed, bucket, seed=7, threads=1)
    assert 6 <= len(first) <= 40, first  # about 30% of 80 requests
    assert _failed_keys(seaweed, bucket, seed=7, threads=8) == first  # concurrent this time
    assert _failed_keys(seaweed, bucket, seed=8, threads=1) != first


def test_a_window_of_slowdown_then_recovery(seaweed, seaweed_proxy, bucket_factory):
    """Rules change while the proxy runs: 100% SlowDown for a second from now, then none; and
    a rule that starts two seconds from now."""
    bucket = bucket_factory(seaweed)
    c = plain(seaweed_proxy.endpoint)
    c.put_object(Bucket=bucket, Key="k", Body=b"0")
    rule = seaweed_proxy.add(Rule(SLOW_DOWN, for_s=1.0), from_now=True)
    later = seaweed_proxy.add(Rule(INTERNAL_ERROR, op="DeleteObject", after_s=2.0),
                              from_now=True)
    start = time.monotonic()
    outcomes = []
    while time.monotonic() < start + 1.5:
        try:
            c.put_object(Bucket=bucket, Key="k", Body=b"1")
            outcomes.append("ok")
        except ClientError as exc:
            outcomes.append(code(exc)[1])
        time.sleep(0.05)
    # SlowDown, then success from the end of the window on
    assert outcomes[0] == "SlowDown" and outcomes[-1] == "ok"
    assert outcomes == sorted(outcomes, key=lambda o: o == "ok")
    slowed = [e.t for e in seaweed_proxy.exchanges(fault="SlowDown")]
    assert rule.applied == len(slowed) and max(slowed) - min(slowed) < 1.0
    c.delete_object(Bucket=bucket, Key="k")  # before the other rule's window
    time.sleep(max(0.0, start + 2.05 - time.monotonic()))
    with pytest.raises(ClientError, match="InternalError"):
        c.delete_object(Bucket=bucket, Key="k")
    seaweed_proxy.remove(later)
    c.delete_object(Bucket=bucket, Key="k")


def test_a_corrupted_body_is_refused_by_its_checksum(seaweed, seaweed_proxy, bucket_factory):
    """One bit of the body's middle byte is flipped on the way and nothing else changes."""
    import base64
    import hashlib

    bucket = bucket_factory(seaweed)
    seaweed_proxy.add(Rule(Corrupt(), op="PutObject"))
    data = payload(1 * MiB + 1, 5)
    c = plain(seaweed_proxy.endpoint)
    md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
    with pytest.raises(ClientError, match="BadDigest"):
        c.put_object(Bucket=bucket, Key="checked", Body=data, ContentMD5=md5)
    c.put_object(Bucket=bucket, Key="unchecked", Body=data)
    stored = bytearray(seaweed.client().get_object(Bucket=bucket, Key="unchecked")["Body"].read())
    stored[len(data) // 2] ^= 0x01
    assert stored == data
    assert [e.fault for e in seaweed_proxy.exchanges()] == ["corrupt", "corrupt"]


def test_an_unreachable_upstream_closes_the_client_connection():
    with FaultProxy("http://127.0.0.1:9").running() as proxy:  # discard port: refused
        with pytest.raises(CONNECTION_LOST):
            plain(S3Endpoint(proxy.url, "k", "s")).list_buckets()
        assert [(e.op, e.outcome) for e in proxy.exchanges()] == [("ListBuckets",
                                                                   "upstream-gone")]


def test_rules_can_change_from_another_thread_while_requests_run(seaweed, seaweed_proxy,
                                                                 bucket_factory):
    bucket = bucket_factory(seaweed)
    c = plain(seaweed_proxy.endpoint, max_pool_connections=4)
    done = threading.Event()
    errors: list[str] = []

    def traffic() -> None:
        while not done.is_set():
            try:
                c.head_bucket(Bucket=bucket)
            except ClientError as exc:
                errors.append(str(code(exc)[0]))

    workers = [threading.Thread(target=traffic) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        for _ in range(20):
            rule = seaweed_proxy.add(Rule(SLOW_DOWN, op="HeadBucket", count=3))
            time.sleep(0.01)
            seaweed_proxy.remove(rule)
    finally:
        done.set()
        for w in workers:
            w.join()
    assert set(errors) <= {"503"}
    assert len(errors) == len(seaweed_proxy.exchanges(fault="SlowDown")) <= 60
    assert {e.outcome for e in seaweed_proxy.exchanges()} == {"ok"}
