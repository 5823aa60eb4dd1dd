"""Run a command and write its own wall time and rusage as JSON: ``_launcher.py OUT -- ARGV``.

Why not ``os.wait4`` on the tool straight from run.py: Linux folds the high-water RSS of the
address space a process had *before* ``exec`` into its ``ru_maxrss``, and a child forked (or
vforked) from the benchmark's Python process starts with that process's ~50+ MiB. This launcher
is started with ``python -I -S`` (about 5 MiB), forks the tool from there and reports what
``os.wait4`` says about it alone, so a tool's peak RSS is floored at ~5 MiB instead.
Only the standard library's ``os``/``sys``/``time`` are used, to keep this process small.
"""

import os
import sys
import time


def main() -> int:
    out, sep, *argv = sys.argv[1:]
    if sep != "--" or not argv:
        print("usage: _launcher.py OUT -- ARGV...", file=sys.stderr)
        return 2
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            print(f"cannot run {argv[0]}: {exc}", file=sys.stderr)
        os._exit(127)
    while True:
        try:
            _, status, ru = os.wait4(pid, 0)
            break
        except InterruptedError:
            continue
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    with open(out, "w") as f:
        f.write(
            f'{{"returncode": {code}, "wall_s": {wall!r}, "user_s": {ru.ru_utime!r}, '
            f'"sys_s": {ru.ru_stime!r}, "maxrss_kib": {ru.ru_maxrss}}}\n'
        )
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
