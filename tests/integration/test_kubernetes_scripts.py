"""The shell scripts of deploy/kubernetes/ run under a real /bin/sh, with a stand-in `mcsync`
on the PATH that records its command line and exits as told: the restore of the training Job
takes exit 4 (no checkpoint yet) as a first start and every other failure as one; the node
cache's loop runs warm then verify, goes on after either fails, and ends at once, with 0, on
SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ..unit.test_kubernetes import by_kind, in_script


def script_of(doc: dict[str, Any], name: str) -> str:
    spec = doc["spec"]["template"]["spec"]
    (container,) = [c for c in spec.get("initContainers", []) + spec["containers"]
                    if c["name"] == name]
    assert container["command"] == ["/bin/sh", "-c"]
    script: str = container["args"][0]
    return script


def fake_mcsync(tmp_path: Path, exits: str) -> dict[str, str]:
    """An environment whose `mcsync` appends its arguments to ``calls`` and exits with the
    next of ``exits`` (one code a line; the last one again once they run out)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "exits").write_text(exits)
    fake = bin_dir / "mcsync"
    fake.write_text(f"""#!/bin/sh
echo "$*" >> {tmp_path}/calls
code=$(head -n 1 {tmp_path}/exits)
rest=$(tail -n +2 {tmp_path}/exits)
[ -n "$rest" ] && printf '%s\\n' "$rest" > {tmp_path}/exits
exit "$code"
""")
    fake.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


@pytest.mark.parametrize(("code", "ok"), [(0, True), (4, True), (1, False), (2, False),
                                          (3, False), (130, False)])
def test_the_restore_takes_no_checkpoint_as_a_first_start(code: int, ok: bool,
                                                          tmp_path: Path) -> None:
    script = script_of(by_kind("Job", "training-job.yaml"), "restore-checkpoint")
    env = fake_mcsync(tmp_path, f"{code}\n")
    done = subprocess.run(["/bin/sh", "-c", script], env=env, timeout=30, check=False)
    assert (done.returncode == 0) is ok
    (argv,) = in_script(script)
    assert (tmp_path / "calls").read_text().split() == argv[1:]


def test_the_node_cache_loop_goes_on_after_a_failure_and_ends_on_sigterm(
        tmp_path: Path) -> None:
    script = script_of(by_kind("DaemonSet"), "mcsync")
    env = fake_mcsync(tmp_path, "1\n1\n")  # both fail: the loop goes on to its sleep
    out = tmp_path / "out"
    with out.open("w") as stdout:  # not a pipe: the sleep left behind would hold it open
        shell = subprocess.Popen(["/bin/sh", "-c", script], env=env, start_new_session=True,
                                 stdout=stdout)
    try:
        calls = tmp_path / "calls"
        deadline = time.monotonic() + 20
        while not (calls.exists() and len(calls.read_text().splitlines()) == 2):
            assert time.monotonic() < deadline, "warm and verify never ran"
            time.sleep(0.05)
        time.sleep(0.2)  # into its sleep
        shell.send_signal(signal.SIGTERM)
        assert shell.wait(timeout=5) == 0
        assert [line.split()[:2] for line in calls.read_text().splitlines()] == [
            ["cache", "warm"], ["cache", "verify"]]
        assert out.read_text().splitlines() == ["mcsync cache warm: exit 1",
                                                "mcsync cache verify: exit 1"]
    finally:
        os.killpg(shell.pid, signal.SIGKILL)  # the sleep it left behind
        shell.wait()
