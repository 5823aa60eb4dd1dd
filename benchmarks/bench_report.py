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
    rows = []
    for (path, data), by_tool in groups.items():
        group_rows = []
        for tool in tools:
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
                "cpu_s": _median(r["cpu_s"] for r in ok),
                "maxrss_mib": _median(r["maxrss_mib"] for r in ok),
                "server_cpu_s": _median(r.get("server_cpu_s") for r in ok),
                "bytes_server_copied": _median(
                    (r.get("report") or {}).get("bytes_server_copied") for r in ok
                ),
            }
            if ok and row["ok"] < row["runs"]:
                row["reason"] = next(r["reason"] for r in tool_runs if r["status"] == "FAIL")
            row["mb_s"] = row["bytes"] / row["wall_s"] / 1e6 if row["wall_s"] else None
            group_rows.append(row)
        peer_times = [r["wall_s"] for r in group_rows if r["peer"] and r["wall_s"]]
        best = min(peer_times) if peer_times else None
        best_tool = next((r["tool"] for r in group_rows if r["peer"] and r["wall_s"] == best), None)
        for row in group_rows:
            row["best_peer"] = best_tool
            row["vs_best_peer"] = row["wall_s"] / best if best and row["wall_s"] else None
        rows.extend(group_rows)
    return rows


def _size(nbytes: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div:
            return f"{nbytes / div:.4g} {unit}"
    return f"{nbytes} B"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


HEADER = ("tool", "wall s", "MB/s", "CPU s", "RSS MiB", "srv CPU s", "÷ best peer")


def render(rows: list[dict], repeat: int) -> str:
    out: list[str] = []
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["path"], row["data"]), []).append(row)
    for (path, data), group in groups.items():
        first = group[0]
        objs = first["objects"]
        done = max(row["runs"] for row in group)
        out.append(
            f"{path} · {data}: {objs:,} object{'s' if objs != 1 else ''}, "
            f"{_size(first['bytes'])}"
            + (f" · median of {done}" if done else "")
            + (f" (of {repeat} planned)" if 0 < done < repeat else "")
        )
        table = [HEADER]
        notes = []
        for row in group:
            name = row["tool"] + ("" if row["peer"] else " *")
            if row["status"] == "n/a":
                table.append((name, f"n/a ({row['reason']})"))
                continue
            if not row["ok"]:
                table.append((name, "FAIL"))
                notes.append(f"  {row['tool']}: FAIL: {row['reason']}")
                continue
            ratio = row["vs_best_peer"]
            table.append((
                name,
                _num(row["wall_s"], ".2f"),
                _num(row["mb_s"], ".1f"),
                _num(row["cpu_s"], ".2f"),
                _num(row["maxrss_mib"], ".0f"),
                _num(row["server_cpu_s"], ".2f"),
                "-" if ratio is None else f"{ratio:.2f}x",
            ))  # fmt: skip
            server_copied = row.get("bytes_server_copied")
            if server_copied:
                notes.append(
                    f"  {row['tool']}: {server_copied / 1e6:,.1f} of {row['bytes'] / 1e6:,.1f} MB "
                    "copied server-side (no bytes through the client)"
                )
            if row["ok"] < row["runs"]:
                notes.append(
                    f"  {row['tool']}: {row['runs'] - row['ok']} of {row['runs']} runs FAILED "
                    f"(median of the rest): {row['reason']}"
                )
        widths = [
            max(len(r[i]) for r in table if len(r) == len(HEADER)) for i in range(len(HEADER))
        ]
        widths[0] = max(len(r[0]) for r in table)
        for r in table:
            if len(r) != len(HEADER):
                out.append(f"  {r[0]:<{widths[0]}}  {r[1]}")
                continue
            cells = [f"{r[0]:<{widths[0]}}"] + [
                f"{c:>{w}}" for c, w in zip(r[1:], widths[1:], strict=True)
            ]
            out.append("  " + "  ".join(cells))
        out.extend(notes)
        out.append("")
    return "\n".join(out)
