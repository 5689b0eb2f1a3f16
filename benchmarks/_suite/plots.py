"""matplotlib PNGs for the report: lateness CDF, send latency around a kill, throughput bars."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks._suite.values import flatten

log = logging.getLogger(__name__)

__all__ = ["collect", "plot_all", "plot_chaos_timeline"]


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _nums(values: Any) -> list[float]:
    if not isinstance(values, list):
        return []
    return [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]


#: metric names that are throughputs, for scenarios that report no ``throughput`` key
RATE_SUFFIXES = ("msgs_per_s", "rows_per_s")


def collect(results: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``key`` from every scenario's result, labels prefixed by scenario (except peers).

    For ``throughput``, a scenario without that key contributes its numbers whose names end
    in msgs_per_s / rows_per_s.
    """
    out: dict[str, Any] = {}
    for name, rec in results.get("scenarios", {}).items():
        result = rec.get("result") or {}
        value = result.get(key)
        if not isinstance(value, dict) and key == "throughput":
            value = {
                k: v
                for k, v in flatten(result)
                if k.endswith(RATE_SUFFIXES) and "due_rate" not in k and isinstance(v, int | float)
            }
        if not isinstance(value, dict):
            continue
        for label, v in value.items():
            out[label if name == "peers" else f"{name}: {label}"] = v
    return out


def plot_lateness_cdf(samples: Mapping[str, Any], path: Path) -> bool:
    """One CDF line per label; x is lateness in ms on a symmetric log scale."""
    series = {k: sorted(_nums(v)) for k, v in samples.items()}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, (label, xs) in enumerate(series.items()):
        n = len(xs)
        # the default colour cycle has 10 colours: dash the lines after it wraps
        style = "-" if i < 10 else "--"
        ax.step(xs, [(k + 1) / n for k in range(n)], where="post", ls=style, label=label)
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlabel("firing lateness, ms (arrival - asked time; < 0 is early)")
    ax.set_ylabel("fraction of messages")
    ax.set_ylim(0, 1.01)
    ax.axvline(0, color="grey", lw=0.8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("Firing lateness CDF")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_timeline(timelines: Mapping[str, Any], path: Path) -> bool:
    """Send latency of each send vs its start time, one panel per label, events marked."""
    panels: list[tuple[str, list[float], list[float], Sequence[Any]]] = []
    for label, tl in timelines.items():
        if not isinstance(tl, dict):
            continue
        t, lat = _nums(tl.get("t_s")), _nums(tl.get("latency_ms"))
        m = min(len(t), len(lat))
        if m:
            panels.append((label, t[:m], lat[:m], tl.get("events") or []))
    if not panels:
        return False
    panels = panels[:6]
    plt = _plt()
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(9, 2.6 * len(panels)), squeeze=False, sharex=True
    )
    for ax, (label, t, lat, events) in zip(axes[:, 0], panels, strict=True):
        ax.scatter(t, [max(x, 0.01) for x in lat], s=2, alpha=0.6)
        ax.set_yscale("log")
        ax.set_ylabel("send ms")
        ax.set_title(label, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        for ev in events:
            if isinstance(ev, list | tuple) and ev and isinstance(ev[0], int | float):
                ax.axvline(ev[0], color="red", lw=1)
                if len(ev) > 1:
                    ax.annotate(
                        str(ev[1]),
                        (ev[0], 1),
                        xycoords=("data", "axes fraction"),
                        xytext=(3, -12),
                        textcoords="offset points",
                        fontsize=8,
                        color="red",
                    )
    axes[-1, 0].set_xlabel("seconds since the run began")
    fig.suptitle("Send latency around a broker fault")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


#: band colours of the chaos timeline, by fault kind
_FAULT_COLOURS = {
    "kill": "tab:red",
    "stop": "tab:orange",
    "pause": "tab:purple",
    "namesrv": "tab:olive",
    "all_down": "black",
}


def plot_chaos_timeline(timelines: Mapping[str, Any], path: Path) -> bool:
    """Faults as bands (one row per target), send latency as dots and delivery rate as a
    line over the run; one panel per label (chaos_bench)."""
    panels = [(k, v) for k, v in timelines.items() if isinstance(v, dict) and v.get("t_s")]
    if not panels:
        return False
    panels = panels[:3]
    plt = _plt()
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 4.2 * len(panels)), squeeze=False)
    for ax, (label, tl) in zip(axes[:, 0], panels, strict=True):
        t, lat = _nums(tl.get("t_s")), _nums(tl.get("latency_ms"))
        m = min(len(t), len(lat))
        targets = sorted({str(b[3]) for b in tl.get("bands") or [] if len(b) >= 4})
        for b in tl.get("bands") or []:
            if len(b) < 4 or not isinstance(b[0], int | float):
                continue
            t1 = b[1] if isinstance(b[1], int | float) and b[1] >= 0 else max(t, default=b[0])
            row = targets.index(str(b[3]))
            lo, hi = row / len(targets), (row + 1) / len(targets)
            ax.axvspan(
                b[0], t1, ymin=lo, ymax=hi, color=_FAULT_COLOURS.get(b[2], "grey"), alpha=0.25, lw=0
            )
        ax.scatter(t[:m], [max(x, 0.01) for x in lat[:m]], s=2, alpha=0.5, label="send latency")
        ax.set_yscale("log")
        ax.set_ylabel("send latency, ms")
        ax.set_xlabel("seconds since the run began")
        ax.grid(True, which="both", alpha=0.3)
        rate_t, rate = _nums(tl.get("rate_t_s")), _nums(tl.get("delivered_per_s"))
        ax2 = ax.twinx()
        n = min(len(rate_t), len(rate))
        ax2.plot(rate_t[:n], rate[:n], color="tab:green", lw=1.2, label="delivered/s")
        ax2.set_ylabel("delivered msgs/s")
        handles = [
            plt.Rectangle((0, 0), 1, 1, color=c, alpha=0.25) for c in _FAULT_COLOURS.values()
        ]
        ax.legend(
            handles + ax2.get_legend_handles_labels()[0],
            [*list(_FAULT_COLOURS), "delivered/s"],
            fontsize=7,
            loc="upper left",
            ncol=3,
        )
        ax.set_title(f"{label}: faults (bands, one row per {', '.join(targets)})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_throughput(values: Mapping[str, Any], path: Path) -> bool:
    """Horizontal bars, msgs/s on a log scale."""
    items = [
        (k, float(v))
        for k, v in values.items()
        if isinstance(v, int | float) and math.isfinite(v) and v > 0
    ]
    if not items:
        return False
    items.sort(key=lambda kv: kv[1])
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(items) + 1.5))
    colors = ["tab:orange" if k.startswith("qclient") or ":" in k else "tab:blue" for k, _ in items]
    ax.barh([k for k, _ in items], [v for _, v in items], color=colors)
    ax.set_xscale("log")
    ax.set_xlabel("msgs/s (log scale)")
    for i, (_, v) in enumerate(items):
        ax.text(v, i, f" {v:,.0f}", va="center", fontsize=8)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.set_title("Throughput (orange: qclient)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_all(results: Mapping[str, Any], out_dir: Path) -> dict[str, str | None]:
    """Draw every plot there is data for; returns {plot: file name or None}."""
    made: dict[str, str | None] = {}
    jobs = [
        ("lateness_cdf", "lateness_samples_ms", plot_lateness_cdf),
        ("failover_timeline", "timeline", plot_timeline),
        ("throughput", "throughput", plot_throughput),
        ("chaos_timeline", "chaos_timeline", plot_chaos_timeline),
    ]
    for name, key, fn in jobs:
        path = out_dir / f"{name}.png"
        try:
            made[name] = path.name if fn(collect(results, key), path) else None
        except Exception:
            log.exception("plot %s failed", name)
            made[name] = None
        if made[name] is None and path.exists():
            path.unlink()  # no stale picture from an earlier run
    return made
