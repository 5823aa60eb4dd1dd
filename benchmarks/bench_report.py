"""Medians per (path, data set, tool) and the tables printed at the end of a run."""

from __future__ import annotations

import statistics
from collections.abc import Iterable


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(runs: list[dict], tools: list[str], peers: set[str]) -> list[dict]:
    """One row per (path, data, tool) in run order, with medians over the successful runs."""
    groups: dict[tuple[str, str], dict[str, list[dict]]] = {}
    for r in runs:
        groups.setdefault((r["path"], r["data"]), {}).setdefault(r["tool"], []).append(r)
    # The given order first, then any other row label (gs-to-meta's reference) as it came.
    order = list(dict.fromkeys([*tools, *(r["tool"] for r in runs)]))
    rows = []
    for (path, data), by_tool in groups.items():
        group_rows = []
        for tool in order:
            tool_runs = by_tool.get(tool)
            if not tool_runs:
                continue
            ok = [r for r in tool_runs if r["status"] == "ok"]
            row = {
                "path": path,
                "data": data,
                "tool": tool,
                "peer": tool in peers,
                "runs": len([r for r in tool_runs if r["status"] in ("ok", "FAIL")]),
                "ok": len(ok),
                "status": "ok" if ok else tool_runs[0]["status"],
                "reason": None if ok else tool_runs[-1].get("reason"),
                "bytes": tool_runs[0]["expected_bytes"],
                "objects": tool_runs[0]["expected_objects"],
                "wall_s": _median(r["wall_s"] for r in ok),
                # The spread behind the median: on the shared 2-core VMs a run's kernel CPU
                # for the same download varied 3x with the state of the host's memory.
                "wall_min_s": min((r["wall_s"] for r in ok), default=None),
                "wall_max_s": max((r["wall_s"] for r in ok), default=None),
                "cpu_s": _median(r["cpu_s"] for r in ok),
                "maxrss_mib": _median(r["maxrss_mib"] for r in ok),
                "server_cpu_s": _median(r.get("server_cpu_s") for r in ok),
                "bytes_server_copied": _median(
                    (r.get("report") or {}).get("bytes_server_copied") for r in ok
                ),
                "bytes_sent": _median(r.get("bytes_sent") for r in ok),
                "bytes_reused_cross_object": _median(
                    (r.get("report") or {}).get("bytes_reused_cross_object") for r in ok
                ),
                "link_tx_bytes": _median(r.get("link_tx_bytes") for r in ok),
                "bytes_sent_assumed": any(r.get("bytes_sent_assumed") for r in ok),
                "change": tool_runs[0].get("change"),
                "link": tool_runs[0].get("link"),
                "procs_max": max((r.get("procs_max") or 0 for r in ok), default=None),
            }
            if ok and row["ok"] < row["runs"]:
                row["reason"] = next(r["reason"] for r in tool_runs if r["status"] == "FAIL")
            row["mb_s"] = row["bytes"] / row["wall_s"] / 1e6 if row["wall_s"] else None
            # Client CPU per GiB of the data set (what a re-sync covered, too: a no-op moves
            # nothing, so bytes sent would divide by zero).
            row["cpu_s_per_gib"] = (
                row["cpu_s"] / (row["bytes"] / GIB) if row["cpu_s"] is not None and row["bytes"]
                else None
            )  # fmt: skip
            group_rows.append(row)
        peer_times = [r["wall_s"] for r in group_rows if r["peer"] and r["wall_s"]]
        best = min(peer_times) if peer_times else None
        best_tool = next((r["tool"] for r in group_rows if r["peer"] and r["wall_s"] == best), None)
        for row in group_rows:
            row["best_peer"] = best_tool
            row["vs_best_peer"] = row["wall_s"] / best if best and row["wall_s"] else None
        rows.extend(group_rows)
    return rows


GIB = 1 << 30


def _size(nbytes: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div:
            return f"{nbytes / div:.4g} {unit}"
    return f"{nbytes} B"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


HEADER = (
    "tool", "wall s", "range", "MB/s", "CPU s", "CPU s/GiB", "RSS MiB", "srv CPU s", "÷ best peer",
)  # fmt: skip
# Re-sync paths: bytes sent matter, MB/s of a no-op does not.
RESYNC_HEADER = (
    "tool", "wall s", "range", "CPU s", "CPU s/GiB", "RSS MiB", "srv CPU s", "sent MB", "sent %",
    "÷ best peer",
)  # fmt: skip
RESYNC_PATHS = ("resync-noop", "delta-s3", "delta-local", "delta-newstep")
GCS_PATH = "gs-to-meta"
S3_REF = "mcsync s3→meta"
# The bars for mcsync.
DELTA_MAX_SENT = 0.03  # of the file
DELTA_MAX_RATIO = 0.25  # of the fastest peer's wall time


def _cells(row: dict, resync: bool) -> tuple[str, ...]:
    ratio = row["vs_best_peer"]
    ratio_s = "-" if ratio is None else f"{ratio:.2f}x"
    low, high = row.get("wall_min_s"), row.get("wall_max_s")
    spread = "-" if low is None or high is None else f"{low:.2f}-{high:.2f}"
    base = (
        _num(row["wall_s"], ".2f"),
        spread,
        _num(row["cpu_s"], ".2f"),
        _num(row.get("cpu_s_per_gib"), ".2f"),
        _num(row["maxrss_mib"], ".0f"),
        _num(row["server_cpu_s"], ".2f"),
    )
    if not resync:
        return (*base[:2], _num(row["mb_s"], ".1f"), *base[2:], ratio_s)
    sent = row.get("bytes_sent")
    mark = "~" if row.get("bytes_sent_assumed") else ""
    sent_mb = "-" if sent is None else f"{sent / 1e6:,.1f}{mark}"
    sent_pct = "-" if sent is None or not row["bytes"] else f"{100 * sent / row['bytes']:.1f}{mark}"
    return (*base, sent_mb, sent_pct, ratio_s)


def _bar_notes(path: str, group: list[dict]) -> list[str]:
    """Whether mcsync meets the issue's bar on this table."""
    mine = next((r for r in group if r["tool"] == "mcsync" and r["ok"]), None)
    peers = [r for r in group if r["peer"] and r["ok"]]
    if mine is None or not peers:
        return []
    ratio = mine["vs_best_peer"]
    if path == "resync-noop":
        met = ratio is not None and ratio < 1
        return [
            f"  bar: mcsync's no-op re-sync faster than every peer: {'met' if met else 'NOT met'}"
            f" ({ratio:.2f}x the fastest, {mine['best_peer']})"
        ]
    if path in ("delta-s3", "delta-local"):
        sent = mine.get("bytes_sent")
        frac = None if sent is None or not mine["bytes"] else sent / mine["bytes"]
        ok_sent = frac is not None and frac <= DELTA_MAX_SENT
        ok_time = ratio is not None and ratio <= DELTA_MAX_RATIO
        frac_s = "?" if frac is None else f"{100 * frac:.1f}%"
        return [
            f"  bar: mcsync sends ≤ {100 * DELTA_MAX_SENT:.0f}% of the file: "
            f"{'met' if ok_sent else 'NOT met'} ({frac_s}); takes ≤ {DELTA_MAX_RATIO:.2f}x the "
            f"fastest peer ({mine['best_peer']}): {'met' if ok_time else 'NOT met'} "
            f"({ratio:.2f}x)"
        ]
    return []


def _wire_notes(path: str, group: list[dict]) -> list[str]:
    """mcsync's cross-object reuse (delta-newstep) and what each tool put on the capped link."""
    notes = []
    for row in group:
        reused = row.get("bytes_reused_cross_object")
        if path == "delta-newstep" and row["ok"] and reused is not None:
            notes.append(
                f"  {row['tool']}: {reused / 1e6:,.1f} MB composed at the target from step-1's "
                "objects (bytes_reused_cross_object)"
            )
    wire = [(r["tool"], r["link_tx_bytes"]) for r in group if r.get("link_tx_bytes") is not None]
    if wire:
        notes.append(
            "  host → B through the link (veth tx counter, with HTTP/TCP overhead): "
            + ", ".join(f"{tool} {n / 1e6:,.1f} MB" for tool, n in wire)
        )
    return notes


def _gcs_notes(group: list[dict]) -> list[str]:
    gs = next((r for r in group if r["tool"] == "mcsync" and r["ok"]), None)
    s3 = next((r for r in group if r["tool"] == S3_REF and r["ok"]), None)
    notes = [
        "  gs:// = fake-gcs-server on 127.0.0.1 (in memory, https) — or, without its binary, "
        "gcp-storage-emulator (http, mcsync only): an emulator figure, not a GCS one"
    ]
    for peer in ("gsutil", "gcloud"):
        other = next((r for r in group if r["tool"] == peer and r["ok"]), None)
        if gs and other and gs["wall_s"]:
            notes.append(f"  {peer} / mcsync wall time: {other['wall_s'] / gs['wall_s']:.2f}x "
                         "(the migration guides' \"2.4x faster than gsutil\" is a GCS figure)")
    if gs and s3 and s3["wall_s"]:
        notes.append(
            f"  mcsync gs→meta: {gs['wall_s'] / s3['wall_s']:.2f}x the wall time of s3→meta "
            f"(the cross path's source and target) on the same data"
        )
    return notes


def render(rows: list[dict], repeat: int) -> str:
    out: list[str] = []
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["path"], row["data"]), []).append(row)
    for (path, data), group in groups.items():
        first = group[0]
        objs = first["objects"]
        done = max(row["runs"] for row in group)
        resync = path in RESYNC_PATHS
        header = RESYNC_HEADER if resync else HEADER
        out.append(
            f"{path} · {data}: {objs:,} object{'s' if objs != 1 else ''}, "
            f"{_size(first['bytes'])}"
            + (f" · median of {done}" if done else "")
            + (f" (of {repeat} planned)" if 0 < done < repeat else "")
            + (f" · {first['link']}" if first.get("link") else "")
        )
        if first.get("change"):
            out.append(f"  change: {first['change']}")
        table = [header]
        notes = []
        for row in group:
            label = (f"mcsync {path.split('-')[0]}→meta"
                     if path in (GCS_PATH, "az-to-meta") and row["tool"] == "mcsync"
                     else row["tool"])
            name = label + ("" if row["peer"] else " *")
            if row["status"] == "n/a":
                table.append((name, f"n/a ({row['reason']})"))
                continue
            if not row["ok"]:
                table.append((name, "FAIL"))
                notes.append(f"  {row['tool']}: FAIL: {row['reason']}")
                continue
            table.append((name, *_cells(row, resync)))
            server_copied = row.get("bytes_server_copied")
            if server_copied:
                notes.append(
                    f"  {row['tool']}: {server_copied / 1e6:,.1f} of {row['bytes'] / 1e6:,.1f} MB "
                    "copied server-side (no bytes through the client)"
                )
            if (row.get("procs_max") or 0) > 1:
                notes.append(
                    f"  {row['tool']}: up to {row['procs_max']} processes at once (RSS is "
                    "their sampled sum when that exceeds the largest one's)"
                )
            if row["ok"] < row["runs"]:
                notes.append(
                    f"  {row['tool']}: {row['runs'] - row['ok']} of {row['runs']} runs FAILED "
                    f"(median of the rest): {row['reason']}"
                )
        if resync:
            if any(r.get("bytes_sent_assumed") for r in group):
                notes.append(
                    "  ~ = assumed, not measured: a peer re-sends a changed file whole; "
                    "mcsync's figure is bytes_sent from its report"
                )
            notes.extend(_bar_notes(path, group))
        notes.extend(_wire_notes(path, group))
        if path == GCS_PATH:
            notes.extend(_gcs_notes(group))
        widths = [
            max(len(r[i]) for r in table if len(r) == len(header)) for i in range(len(header))
        ]
        widths[0] = max(len(r[0]) for r in table)
        for r in table:
            if len(r) != len(header):
                out.append(f"  {r[0]:<{widths[0]}}  {r[1]}")
                continue
            cells = [f"{r[0]:<{widths[0]}}"] + [
                f"{c:>{w}}" for c, w in zip(r[1:], widths[1:], strict=True)
            ]
            out.append("  " + "  ".join(cells))
        out.extend(notes)
        out.append("")
    return "\n".join(out)
