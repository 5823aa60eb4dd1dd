"""What starting the command costs: importing it loads none of the clients a run may not need.
Each is imported by the first request that needs it (aiohttp + botocore ~0.2 s, awscrt
~0.04 s, the XML parser ~2.5 ms), so a run that does not need one never pays for it. And what
using the library costs its caller's process: nothing written into its environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys

LATER = ("aiohttp", "botocore", "aiobotocore", "awscrt", "xml.etree.ElementTree",
         "prometheus_client", "tqdm", "watchfiles", "ray")  # ray: --executor ray's alone


def test_importing_the_command_loads_no_client_a_run_may_not_need() -> None:
    code = ("import json, sys; import mcsync, mcsync.cli.main, mcsync.scale.workers; "
            f"print(json.dumps([m for m in {LATER!r} if m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert json.loads(done.stdout) == []


def test_the_version_is_printed_without_reading_every_installed_package() -> None:
    """``mcsync --version`` prints the version the package holds; looking it up by name
    (importlib.metadata) read every installed distribution's metadata first."""
    from mcsync import __version__

    code = ("import sys; sys.argv = ['mcsync', '--version']\n"
            "from mcsync.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('importlib.metadata' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.splitlines() == [f"mcsync, version {__version__}", "False"]


def test_the_library_leaves_its_callers_environment_as_it_was(tmp_path) -> None:
    """Importing mcsync, tuning the process and running a sync write nothing into
    ``os.environ``: only the command's entry point sets what it needs."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.bin").write_bytes(b"a")
    code = ("import os; before = dict(os.environ)\n"
            "import mcsync; mcsync.tune_process()\n"
            f"report = mcsync.sync({str(tmp_path / 'src')!r}, {str(tmp_path / 'dst')!r}, "
            f"manifest={str(tmp_path / 'm.db')!r})\n"
            "assert report.objects_copied == 1, report\n"
            "print(sorted(set(os.environ.items()) ^ set(before.items())))")
    # Unset here, so a library that set botocore's switch (as the command does) would show.
    env = {k: v for k, v in os.environ.items() if k != "BOTO_DISABLE_CRT"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True, env=env)
    assert done.stdout.strip() == "[]"
