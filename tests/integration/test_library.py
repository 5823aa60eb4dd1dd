"""The library as a pipeline calls it, against real servers (moto and SeaweedFS processes):
typed options, a graceful ``stop=`` and the same call resuming, an s3:// source and an s3://
target on two endpoints with keys of their own in one call, failures that say their kind and
whether a retry may help, and ``sync()`` called from inside a running event loop. Every
result is checked byte for byte."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

import mcsync
from mcsync import StoreOptions, SyncOptions
from mcsync.events import Event, ObjectDone
from mcsync.state.manifest import last_run_status
from testbed.faultproxy import Reply, Rule
from testbed.servers import S3Endpoint

from .helpers import payload, put_objects, read_bucket, read_tree, write_tree
from .proxy import CorruptingProxy

MiB = 1 << 20
ACCESS_DENIED = Reply(403, "AccessDenied", "Access Denied")


def use_keys(monkeypatch: pytest.MonkeyPatch, ep: S3Endpoint) -> None:
    """``ep``'s keys and region from the environment (not its endpoint: each call names it)."""
    for name, value in ep.aws_env().items():
        if not name.startswith("AWS_ENDPOINT_URL"):
            monkeypatch.setenv(name, value)


def test_typed_options_with_overrides(moto, tmp_path, monkeypatch, bucket_factory):
    bucket = bucket_factory(moto)
    objects = {"a.bin": payload(3000, 1), "b.txt": b"text", "d/c.bin": payload(6 * MiB, 2)}
    put_objects(moto, bucket, objects)
    use_keys(monkeypatch, moto)
    options = SyncOptions(concurrency=4, include=("*.txt",),
                          source=StoreOptions(endpoint_url=moto.url))
    dst = tmp_path / "dst"

    with pytest.raises(TypeError, match="unknown option 'part_sise'"):
        mcsync.sync(f"s3://{bucket}/", str(dst), options, part_sise=5 * MiB)
    assert not dst.exists()  # refused before anything was opened

    report = mcsync.sync(f"s3://{bucket}/", str(dst), options, include="*.bin",
                         part_size=5 * MiB)  # the override wins over the record's include
    assert report.exit_code == 0 and report.objects_copied == 2
    assert read_tree(dst) == {k: v for k, v in objects.items() if k.endswith(".bin")}


def test_stop_ends_the_run_with_state_saved_and_the_same_call_resumes(seaweed, tmp_path,
                                                                     monkeypatch,
                                                                     bucket_factory):
    objects = {f"shard-{i:02d}.bin": payload(256 * 1024 + i, i) for i in range(24)}
    objects["big.bin"] = payload(12 * MiB, 99)  # multipart: journalled if caught in flight
    write_tree(tmp_path / "src", objects)
    bucket = bucket_factory(seaweed)
    use_keys(monkeypatch, seaweed)
    options = SyncOptions(concurrency=2, part_size=5 * MiB, part_concurrency=1,
                          target=StoreOptions(endpoint_url=seaweed.url))

    def first_done_stops(stop: asyncio.Event):
        def on_event(event: Event) -> None:
            if isinstance(event, ObjectDone):
                stop.set()  # on the run's loop thread: an asyncio.Event may be set here
        return on_event

    stop = asyncio.Event()
    first = mcsync.sync(str(tmp_path / "src"), f"s3://{bucket}/", options, stop=stop,
                        on_event=first_done_stops(stop))
    assert first.interrupted and first.exit_code == 130
    assert 1 <= first.objects_copied < len(objects)
    assert first.manifest is not None and last_run_status(Path(first.manifest))[1] == "interrupted"
    copied = read_bucket(seaweed, bucket)
    assert all(objects[k] == v for k, v in copied.items())  # what is there is whole

    again = mcsync.sync(str(tmp_path / "src"), f"s3://{bucket}/", options)
    assert again.exit_code == 0 and not again.interrupted
    assert again.objects_copied == len(objects) - first.objects_copied
    assert again.objects_skipped == first.objects_copied
    assert read_bucket(seaweed, bucket) == objects


def test_a_threading_event_stops_a_blocking_sync_from_another_thread(moto, tmp_path,
                                                                      monkeypatch,
                                                                      bucket_factory):
    objects = {f"f-{i:02d}.bin": payload(200_000, i) for i in range(40)}
    write_tree(tmp_path / "src", objects)
    bucket = bucket_factory(moto)
    use_keys(monkeypatch, moto)
    stop = threading.Event()
    stopper = threading.Timer(0.0, stop.set)

    def on_event(event: Event) -> None:
        if isinstance(event, ObjectDone) and stopper.ident is None:
            stopper.start()  # another thread sets it

    options = SyncOptions(concurrency=1, target=StoreOptions(endpoint_url=moto.url))
    first = mcsync.sync(str(tmp_path / "src"), f"s3://{bucket}/", options, stop=stop,
                        on_event=on_event)
    stopper.join()
    assert first.interrupted and first.objects_copied < len(objects)
    again = mcsync.sync(str(tmp_path / "src"), f"s3://{bucket}/", options)
    assert again.ok and read_bucket(moto, bucket) == objects


def test_two_s3_endpoints_with_keys_of_their_own_in_one_call(seaweed, seaweed_b, tmp_path,
                                                              monkeypatch, bucket_factory):
    """An s3:// source and an s3:// target on two servers, each refusing the other's keys:
    each side gets its endpoint and its profile (keys) from its own StoreOptions."""
    src_bucket, dst_bucket = bucket_factory(seaweed), bucket_factory(seaweed_b)
    objects = {"small/a.bin": payload(70_000, 1), "big.bin": payload(11 * MiB + 7, 2),
               "empty": b""}
    put_objects(seaweed, src_bucket, objects, prefix="run-7/")
    (tmp_path / "credentials").write_text(
        f"[source]\naws_access_key_id = {seaweed.access_key}\n"
        f"aws_secret_access_key = {seaweed.secret_key}\n"
        f"[target]\naws_access_key_id = {seaweed_b.access_key}\n"
        f"aws_secret_access_key = {seaweed_b.secret_key}\n")
    (tmp_path / "config").write_text("[profile source]\nregion = us-east-1\n"
                                     "[profile target]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))

    report = mcsync.sync(f"s3://{src_bucket}/run-7/", f"s3://{dst_bucket}/run-7/",
                         part_size=5 * MiB,
                         source=StoreOptions(endpoint_url=seaweed.url, profile="source"),
                         target=StoreOptions(endpoint_url=seaweed_b.url, profile="target"))
    assert report.exit_code == 0, report.failures
    assert report.objects_copied == 3 and report.objects_server_copied == 0
    assert read_bucket(seaweed_b, dst_bucket, "run-7/") == objects


def test_failures_carry_their_kind_and_whether_a_retry_may_help(moto_proxy, seaweed, tmp_path,
                                                                monkeypatch, bucket_factory):
    """A source object the store refuses to read (403 AccessDenied from the proxy in front
    of moto) and one whose bytes the target refuses as damaged (BadDigest from SeaweedFS)."""
    src_bucket, dst_bucket = bucket_factory(moto_proxy.upstream), bucket_factory(seaweed)
    objects = {"ok.bin": payload(5000, 1), "private/secret.bin": payload(5000, 2),
               "damaged/x.bin": payload(5000, 3)}
    put_objects(moto_proxy.upstream, src_bucket, objects)
    moto_proxy.add(Rule(ACCESS_DENIED, op="GetObject", key="*private/*"))
    use_keys(monkeypatch, seaweed)  # moto takes any keys
    with CorruptingProxy(seaweed.url, marker="/damaged/").running() as damaging:
        report = mcsync.sync(f"s3://{src_bucket}/", f"s3://{dst_bucket}/",
                             source=StoreOptions(endpoint_url=moto_proxy.url),
                             target=StoreOptions(endpoint_url=damaging.url))
    assert report.exit_code == 1
    failed = {f.key: (f.kind, f.retryable) for f in report.failures}
    assert failed == {"private/secret.bin": ("AccessDenied", False),
                      "damaged/x.bin": ("IntegrityError", True)}, report.failures
    assert report.to_dict()["failures"][0].keys() == {"key", "error", "kind", "retryable"}
    assert read_bucket(seaweed, dst_bucket) == {"ok.bin": objects["ok.bin"]}


def test_sync_called_inside_a_running_event_loop(moto, tmp_path, monkeypatch, bucket_factory):
    """As a notebook cell calls it: the blocking form works there too."""
    objects = {"a.bin": payload(100_000, 1), "d/b.bin": payload(6 * MiB, 2)}
    write_tree(tmp_path / "src", objects)
    bucket = bucket_factory(moto)
    use_keys(monkeypatch, moto)
    seen: list[str] = []

    async def cell() -> mcsync.SyncReport:
        return mcsync.sync(str(tmp_path / "src"), f"s3://{bucket}/", part_size=5 * MiB,
                           target=StoreOptions(endpoint_url=moto.url),
                           on_event=lambda e: seen.append(type(e).__name__))

    report = asyncio.run(cell())
    assert report.exit_code == 0 and report.objects_copied == 2
    assert seen[0] == "RunStarted" and seen[-1] == "RunFinished"
    assert read_bucket(moto, bucket) == objects


def test_watch_from_the_library_until_stopped(tmp_path):
    """The library's watch: cycles until a stop, the last one returned."""
    write_tree(tmp_path / "src", {"step-1/w.bin": b"one"})
    stop = asyncio.Event()
    cycles: list[mcsync.Cycle] = []

    def seen(cycle: mcsync.Cycle) -> None:
        cycles.append(cycle)
        if cycle.number == 1:
            write_tree(tmp_path / "src", {"step-2/w.bin": b"two"})
        else:
            stop.set()

    last = mcsync.watch(str(tmp_path / "src"), str(tmp_path / "dst"), stop=stop,
                        interval=0.05, min_age_s=0, on_cycle=seen)
    assert last is cycles[-1] and [c.report.objects_copied for c in cycles if c.report] == [1, 1]
    assert read_tree(tmp_path / "dst") == {"step-1/w.bin": b"one", "step-2/w.bin": b"two"}
