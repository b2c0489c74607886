"""Helpers shared by the memory benchmarks: tables, JSON."""

from __future__ import annotations

import json
import platform
import time


def print_table(rows: list[dict], columns: list[str]) -> None:
    """Print ``rows`` as a Markdown table with ``columns``."""
    def fmt(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for r in rows:
        print("| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |")


def write_json(path: str | None, name: str, args, rows: list[dict]) -> None:
    """Write ``rows`` with the arguments and machine to ``path`` (if given)."""
    if not path:
        return
    doc = {"benchmark": name, "args": vars(args), "machine": platform.machine(),
           "processor": platform.processor(), "time": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                     time.gmtime()),
           "rows": rows}
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
