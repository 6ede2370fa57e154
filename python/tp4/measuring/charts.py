"""The PNG charts of `tp4 report`: decode aggregate tok/s by concurrency (one panel per prompt
type) and prefill tok/s by prompt length, each run against the reference.

matplotlib is imported here, inside the functions, only when a chart is drawn (it costs ~0.4 s;
`tp4 --help` and `tp4 plan` never pay it). The figures are drawn with matplotlib's own defaults
(not the user's matplotlibrc) on the Agg canvas and saved without the PNG's Software entry, so
the same report gives the same bytes with the same matplotlib.
"""

from __future__ import annotations

import io
import math
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tp4.core.errors import InvalidInput
from tp4.measuring.report import Measurements, Report, _prompt_key, filler_text

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DECODE_PNG = "report-decode.png"
PREFILL_PNG = "report-prefill.png"
DPI = 100
WIDTH_IN = 8.0
PANEL_HEIGHT_IN = 3.0  # per row of decode panels: 2 x 2 panels are 800 x 600 pixels
PREFILL_HEIGHT_IN = 4.0


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _points(run: Measurements, prompt_type: str) -> tuple[list[int], list[float], list[int], list[float]]:
    """(levels, values) that are valid, and those shown as invalid or failed."""
    ok_x, ok_y, bad_x, bad_y = [], [], [], []
    for (ptype, level), cell in sorted(run.decode["aggregate"].items()):
        if ptype != prompt_type or cell.value is None:
            continue
        if cell.status == "ok":
            ok_x.append(level)
            ok_y.append(float(cell.value))
        else:
            bad_x.append(level)
            bad_y.append(float(cell.value))
    return ok_x, ok_y, bad_x, bad_y


def _log2_axis(ax: Axes, ticks: Sequence[int], prefix: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ticks), [f"{prefix}{t}" for t in ticks])
    ax.minorticks_off()
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)


def _run_names(report: Report) -> list[str]:
    return [run.name if len(run.name) <= 40 else "…" + run.name[-39:] for run in report.runs]


REFERENCE_ZORDER = 4  # above the runs' lines (matplotlib draws lines at 2): a run equal to the reference hides it not


def decode_chart(report: Report) -> bytes | None:
    fig = decode_figure(report)
    return None if fig is None else _png(fig)


def decode_figure(report: Report) -> Figure | None:
    """The decode chart: one panel per prompt type, aggregate tok/s by concurrency."""
    from matplotlib import style

    prompt_types = sorted(
        {k[0] for run in report.runs for k, c in run.decode["aggregate"].items() if c.value is not None},
        key=_prompt_key,
    )
    if not prompt_types:
        return None
    ref = report.reference
    with style.context("default"):
        cols = 2 if len(prompt_types) > 1 else 1
        rows = math.ceil(len(prompt_types) / cols)
        fig = _figure(WIDTH_IN, PANEL_HEIGHT_IN * rows)
        axes = fig.subplots(rows, cols, squeeze=False)
        names = _run_names(report)
        marked = False
        for i, prompt_type in enumerate(prompt_types):
            ax = axes[i // cols][i % cols]
            levels: set[int] = set()
            ref_points = sorted(
                (lv, float(c.value))
                for (pt, lv), c in ref.decode["aggregate"].items()
                if pt == prompt_type and c.value is not None
            )
            ax.plot(
                [p[0] for p in ref_points],
                [p[1] for p in ref_points],
                "k--o",
                markersize=4,
                linewidth=1.2,
                zorder=REFERENCE_ZORDER,
                label=f"reference {ref.name}" if ref_points else "_nolegend_",
            )
            levels.update(p[0] for p in ref_points)
            for j, run in enumerate(report.runs):
                ok_x, ok_y, bad_x, bad_y = _points(run, prompt_type)
                colour = f"C{j % 10}"
                ax.plot(
                    ok_x,
                    ok_y,
                    "-o",
                    color=colour,
                    markersize=5,
                    linewidth=1.8,
                    label=names[j] if ok_x else "_nolegend_",
                )
                if bad_x:
                    ax.plot(bad_x, bad_y, "x", color=colour, markersize=9, markeredgewidth=2, label=names[j])
                    marked = True
                levels.update(ok_x + bad_x)
            _log2_axis(ax, sorted(levels), "c")
            ax.set_title(prompt_type, fontsize=10)
            if i % cols == 0:
                ax.set_ylabel("aggregate tok/s")
            if i + cols >= len(prompt_types):  # the lowest panel of its column
                ax.set_xlabel("concurrency (streams)")
        # one entry per run that has data in some panel (its first line), the reference first
        seen: dict[str, Artist] = {}
        for row in axes:
            for ax in row:
                for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                    seen.setdefault(label, handle)
        labels = [label for label in [f"reference {ref.name}", *names] if label in seen]
        handles = [seen[label] for label in labels]
        if marked:
            from matplotlib.lines import Line2D

            handles.append(Line2D([], [], linestyle="none", marker="x", color="0.4", markersize=8, markeredgewidth=2))
            labels.append("invalid or failed: not judged")
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3), fontsize=8, frameon=False)
        for k in range(len(prompt_types), rows * cols):
            axes[k // cols][k % cols].set_visible(False)
        fig.suptitle("decode: aggregate tok/s by concurrency", fontsize=11)
        return fig


def prefill_chart(report: Report) -> bytes | None:
    fig = prefill_figure(report)
    return None if fig is None else _png(fig)


def prefill_figure(report: Report) -> Figure | None:
    """The prefill chart: tok/s by prompt length."""
    from matplotlib import style

    if not any(run.prefill for run in report.runs):
        return None
    ref = report.reference
    with style.context("default"):
        fig = _figure(WIDTH_IN, PREFILL_HEIGHT_IN)
        ax = fig.subplots()
        lengths: set[int] = set()
        ref_rows = sorted((t, c) for t, c in ref.prefill.items() if c.value is not None)
        if ref_rows:
            ax.plot(
                [t for t, _ in ref_rows],
                [float(c.value or 0) for _, c in ref_rows],
                "k--o",
                markersize=4,
                linewidth=1.2,
                zorder=REFERENCE_ZORDER,
                label=f"reference {ref.name} ({filler_text(ref.prefill_filler)})",
            )
            passes = [(t, float(v)) for t, c in ref_rows for v in c.samples]
            ax.plot(
                [p[0] for p in passes], [p[1] for p in passes], "k.", markersize=4, alpha=0.5, zorder=REFERENCE_ZORDER
            )
            lengths.update(t for t, _ in ref_rows)
        for j, (run, name) in enumerate(zip(report.runs, _run_names(report), strict=True)):
            rows = sorted((t, c) for t, c in run.prefill.items() if c.value is not None)
            ok = [(t, float(c.value or 0)) for t, c in rows if c.status == "ok"]
            bad = [(t, float(c.value or 0)) for t, c in rows if c.status != "ok"]
            colour = f"C{j % 10}"
            ax.plot(
                [p[0] for p in ok],
                [p[1] for p in ok],
                "-o",
                color=colour,
                markersize=5,
                linewidth=1.8,
                label=f"{name} ({filler_text(run.prefill_filler)})" if ok else "_nolegend_",
            )
            if bad:
                ax.plot(
                    [p[0] for p in bad],
                    [p[1] for p in bad],
                    "x",
                    color=colour,
                    markersize=9,
                    markeredgewidth=2,
                    label=f"{name}: invalid",
                )
            lengths.update(t for t, _ in rows)
        ticks = sorted(lengths)
        ax.set_xscale("log", base=2)
        ax.set_xticks(
            ticks, [ref.prefill_labels.get(t) or (f"{t // 1024}k" if t % 1024 == 0 else str(t)) for t in ticks]
        )
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("prefill tok/s")
        ax.legend(fontsize=7, loc="lower right")
        fig.suptitle(
            "prefill: tok/s by prompt length (the fillers differ: not comparable, see the report)"
            if len({ref.prefill_filler} | {r.prefill_filler for r in report.runs if r.prefill}) > 1
            else "prefill: tok/s by prompt length",
            fontsize=11,
        )
        return fig


def _check_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InvalidInput(f"--out {out_dir}: exists and is not a directory; fix: name a directory") from None
    except OSError as exc:
        raise InvalidInput(
            f"--out {out_dir}: cannot create it: {exc.strerror}; fix: name a directory you can write to"
        ) from None


def _target(out_dir: Path, name: str) -> Path:
    path = out_dir / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInput(
            f"--out {out_dir}: {name} exists and is not a regular file; fix: remove it or choose another --out"
        )
    return path


def _write(path: Path, data: bytes) -> None:
    """Atomically: a temporary file beside it, renamed into place."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise InvalidInput(
            f"cannot write {path}: {exc.strerror}; fix: choose an --out directory you can write to"
        ) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InvalidInput(f"cannot write {path}: {exc.strerror}; fix: free space or choose another --out") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_charts(report: Report, out_dir: Path) -> list[Path]:
    """Draw every chart first, then write them: a failure leaves no chart half-written."""
    _check_dir(out_dir)
    drawn = [
        (name, data)
        for name, data in ((DECODE_PNG, decode_chart(report)), (PREFILL_PNG, prefill_chart(report)))
        if data is not None
    ]
    targets = [(_target(out_dir, name), data) for name, data in drawn]
    for path, data in targets:
        _write(path, data)
    return [path for path, _ in targets]
