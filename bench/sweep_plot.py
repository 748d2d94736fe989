"""The sweep's two Pareto plots (PNG, matplotlib's Agg backend; bench/requirements.txt).

decode.png: per-user output tok/s (x) against aggregate output tok/s (y), one series per engine, each
point labeled with its concurrency; prefill.png: time to first token in ms (x) against prefill tok/s
(y), points labeled "L x b" (prompt length x batch). Axes are logarithmic when the values span more
than a factor of 10 (else linear). Each engine's frontier (its points no other of its points beats on
both axes: faster for users and more tokens/s; sooner first token and more tokens/s) is drawn as a
line through them, the dominated points stay as open markers.
"""
import os
import textwrap

REQUIREMENTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "requirements.txt")


class PlotUnavailable(Exception):
    pass


def frontier(points, x_better):
    """Indices of the points (x, y) that no other point beats on both axes (y: higher is better; x:
    higher is better when x_better == "high", lower when "low"), sorted by x."""
    sign = 1 if x_better == "high" else -1
    keep = []
    for i, (x, y) in enumerate(points):
        beaten = any((sign * ox >= sign * x and oy >= y) and (ox, oy) != (x, y) for ox, oy in points)
        if not beaten:
            keep.append(i)
    return sorted(keep, key=lambda i: points[i][0])


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(f"matplotlib is not installed: pip install -r {REQUIREMENTS}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _axis_scale(ax, xs, ys):
    def span(v):
        v = [a for a in v if a and a > 0]
        return max(v) / min(v) if v else 1
    if span(xs) > 10:
        ax.set_xscale("log")
    if span(ys) > 10:
        ax.set_yscale("log")


def _plot(path, series, xkey, ykey, x_better, label_of, xlabel, ylabel, title):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    xs_all, ys_all = [], []
    for k, (engine, rows) in enumerate(series.items()):
        rows = [r for r in rows if r.get(xkey) and r.get(ykey)]
        if not rows:
            continue
        color = f"C{k}"
        pts = [(float(r[xkey]), float(r[ykey])) for r in rows]
        xs_all += [p[0] for p in pts]
        ys_all += [p[1] for p in pts]
        front = frontier(pts, x_better)
        ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "-o", color=color, label=f"{engine} (frontier)")
        rest = [i for i in range(len(pts)) if i not in front]
        if rest:
            ax.plot([pts[i][0] for i in rest], [pts[i][1] for i in rest], "o", mfc="none", color=color)
        for r, (x, y) in zip(rows, pts):
            ax.annotate(label_of(r), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=color)
    _axis_scale(ax, xs_all, ys_all)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    # long subtitles (model, machine, commit) wrapped to the figure's width instead of cut off
    ax.set_title("\n".join(textwrap.fill(line, 110) for line in title.split("\n")), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def decode_plot(path, series, title):
    _plot(path, series, "per_user_tok_s", "output_tok_s", "high", lambda r: f"c={r['concurrency']}",
          "per-user output tokens/s (1 / mean time per output token)", "aggregate output tokens/s",
          "Decode: throughput vs per-user speed\n" + title)


def prefill_plot(path, series, title):
    _plot(path, series, "mean_ttft_ms", "prefill_tok_s", "low", lambda r: f"{r['prompt_len']}x{r['batch']}",
          "time to first token, ms (mean over the batch)", "prefill tokens/s",
          "Prefill: throughput vs time to first token (labels: prompt length x batch)\n" + title)
