"""Run a command and write its own wall time and rusage as JSON: ``rusage.py OUT -- ARGV``.

The benchmarks (``benchmarks/bench_measure.py``) and the scale tests
(``tests/integration/test_scale.py``) measure a tool with it; ``launcher_argv`` is the command
line they run.

Why not ``os.wait4`` on the tool straight from the benchmark's process: Linux folds the
high-water RSS of the address space a process had *before* ``exec`` into its ``ru_maxrss``, and
a child forked (or vforked) from the benchmark's Python process starts with that process's ~50+
MiB. This launcher is started with ``python -I -S`` (about 5 MiB), forks the tool from there and
reports what ``os.wait4`` says about it alone, so a tool's peak RSS is floored at ~5 MiB
instead.

``ru_maxrss`` is the largest RSS of *one* process of the tree (the tool, or a descendant it
waited for), not the sum of processes running at the same time. So while the tool runs, the
launcher also samples the tree every ``SAMPLE_S`` seconds from ``/proc``: the tool and every
process descended from it or in its session (the benchmarks start this launcher in a session of
its own; the launcher itself is not counted; the process list is refreshed every ``RESCAN``
samples), summing their RSS. The report has the peak of that sum (``tree_rss_peak_kib``) and
the most processes seen at once (``tree_procs_max``), and the tool's own high-water RSS
(``tool_hwm_kib``: ``VmHWM`` of its process alone, without its workers, as last read before it
ended: a driver's peak). The wait wakes on the tool's exit at once
(a pidfd), so sampling adds nothing to the wall time.
Only built-in modules are used (``os``, ``sys``, ``time``, ``select``), to keep this process
small.
"""

import os
import select
import sys
import time

SAMPLE_S = 0.1
RESCAN = 5  # samples between two walks over /proc
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, session, RSS pages) of a process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp session ... rss(24th field)"; comm may hold anything.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[1]), int(fields[3]), int(fields[21])
    except (IndexError, ValueError):
        return None


def hwm_kib(pid: int) -> int:
    """The high-water RSS of one process (``VmHWM``: the kernel's own peak, not sampled), 0 if
    it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def find_tree(root: int, me: int) -> set[int]:
    """``root`` and its descendants, and every process of ``me``'s session, but not ``me``."""
    procs = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            procs[int(name)] = st
    children: dict[int, list[int]] = {}
    for pid, (ppid, _sid, _rss) in procs.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree and pid in procs:
            tree.add(pid)
            todo.extend(children.get(pid, ()))
    tree |= {pid for pid, (_ppid, sid, _rss) in procs.items() if sid == me}
    tree.discard(me)
    return tree


def tree_rss(pids: set[int]) -> tuple[int, int]:
    """(KiB resident, processes alive) of ``pids``."""
    total = n = 0
    for pid in pids:
        st = _stat(pid)
        if st is not None:
            total, n = total + st[2], n + 1
    return total * PAGE_KIB, n


def launcher_argv(report: object, argv: list[str]) -> list[str]:
    """The command line that runs ``argv`` under this launcher, which writes its JSON report to
    ``report`` (a path). Started with ``python -I -S``, so the launcher stays ~5 MiB."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(report), "--", *argv]


def main() -> int:
    out, sep, *argv = sys.argv[1:]
    if sep != "--" or not argv:
        print("usage: rusage.py OUT -- ARGV...", file=sys.stderr)
        return 2
    me = os.getpid()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            print(f"cannot run {argv[0]}: {exc}", file=sys.stderr)
        os._exit(127)
    peak_kib = procs_max = tool_hwm = 0
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None  # no pidfd (old kernel): no sampling, ru_maxrss only
    if pidfd is not None:
        samples, tree = 0, {pid}
        while True:
            try:
                ready, _, _ = select.select([pidfd], [], [], SAMPLE_S)
            except InterruptedError:
                continue
            if ready:
                break
            # A walk over /proc (~2 ms) every RESCAN samples finds new processes; in between
            # only the known ones are read.
            if samples % RESCAN == 0:
                tree = find_tree(pid, me)
            samples += 1
            kib, n = tree_rss(tree)
            peak_kib, procs_max = max(peak_kib, kib), max(procs_max, n)
            tool_hwm = max(tool_hwm, hwm_kib(pid))
        os.close(pidfd)
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
            f'"sys_s": {ru.ru_stime!r}, "maxrss_kib": {ru.ru_maxrss}, '
            f'"tree_rss_peak_kib": {peak_kib if pidfd is not None else "null"}, '
            f'"tree_procs_max": {procs_max if pidfd is not None else "null"}, '
            f'"tool_hwm_kib": {tool_hwm if pidfd is not None else "null"}}}\n'
        )
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
