"""The demo's figure: latency CDF per policy and SLO attainment per priority class."""

from __future__ import annotations

import math


def plot_comparison(results: dict, path: str, title: str) -> str:
    """Write a PNG comparing policies. ``results``: policy -> {"latencies_s": [...],
    **summarize(...)}; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_cdf, ax_bar) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, res in results.items():
        lat = sorted(x for x in res["latencies_s"] if math.isfinite(x))
        if lat:
            ys = [(i + 1) / len(res["latencies_s"]) for i in range(len(lat))]
            p95 = res["p95_s"]
            ax_cdf.plot(lat, ys, label=f"{name} (P95 {p95:.2f} s)")
    ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("end-to-end latency (s)")
    ax_cdf.set_ylabel("fraction of requests")
    ax_cdf.axhline(0.95, color="grey", lw=0.6, ls=":")
    ax_cdf.legend()
    ax_cdf.set_title("latency CDF")
    names = list(results)
    width = 0.8 / max(1, len(names))
    classes = ["0", "1", "2", "all"]
    for i, name in enumerate(names):
        s = results[name]
        vals = [100 * (s["per_priority"][c]["slo_attainment"] or 0) for c in classes[:3]]
        vals.append(100 * s["slo_attainment"])
        ax_bar.bar([k + i * width for k in range(4)], vals, width, label=name)
    ax_bar.set_xticks([k + width * (len(names) - 1) / 2 for k in range(4)])
    ax_bar.set_xticklabels(["high (0)", "normal (1)", "low (2)", "all"])
    ax_bar.set_ylabel("SLO attainment (%)")
    ax_bar.set_ylim(0, 105)
    ax_bar.axhline(99, color="grey", lw=0.6, ls=":")
    ax_bar.legend()
    ax_bar.set_title("SLO attainment by priority")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
