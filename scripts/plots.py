"""PNG plots beside a benchmark's JSON (matplotlib, `pip install "shoal[bench]"`): a
benchmark that compares systems over time or size draws its figures with these."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib.pyplot for files (Agg), or None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def line_plot(path: str | Path, x: list, panels: list[dict], xlabel: str, title: str = "") -> Path | None:
    """One panel per dict {"ylabel", "series": {label: [y per x]}, ["log": bool]},
    stacked; returns the PNG's path (None, with a note, without matplotlib)."""
    plt = pyplot()
    path = Path(path)
    if plt is None:
        print(f"(no plot: pip install matplotlib, then run again for {path})")
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.8 * len(panels)), squeeze=False, sharex=True)
    for ax, panel in zip(axes[:, 0], panels):
        for label, ys in panel["series"].items():
            ax.plot(x, ys, marker="o", label=label)
        ax.set_ylabel(panel["ylabel"])
        if panel.get("log"):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel(xlabel)
    if title:
        axes[0, 0].set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")
    return path
