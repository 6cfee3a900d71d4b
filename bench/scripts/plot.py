#!/usr/bin/env python3
"""Draws the curves of BENCHMARKS.md as SVG from the JSON results of curves.sh.

Usage: plot.py RESULTS_DIR PLOTS_DIR
       plot.py --soak SOAK_JSON PLOTS_DIR

Reads RESULTS_DIR/{fanout,idle,load}-{im,mosquitto}-N.json (`im-bench peer --json`) and
writes PLOTS_DIR/fanout.svg, idle.svg and load.svg: one line per server; group sizes
and loads on a log scale (latencies too), connections on a linear one. Python's standard library only, so it runs
wherever the bench does. A point whose run did not pass its exactly-once check is drawn
hollow and named in the legend's note.

With --soak it reads one `im-bench soak --json` report and writes PLOTS_DIR/soak-rss.svg
(server RSS, jemalloc `resident` and `allocated`, SQLite's memory per window) and PLOTS_DIR/soak-p99.svg (send→ack and delivery P99 per
window), both against minutes of the measured run.
"""

import glob
import json
import math
import os
import re
import sys
from xml.sax.saxutils import escape

W, H = 640, 400
LEFT, RIGHT, TOP, BOTTOM = 70, 150, 40, 55
COLORS = {"im": "#1f77b4", "mosquitto": "#d62728", "rss": "#1f77b4", "heap": "#ff7f0e",
          "resident": "#9467bd", "sqlite": "#8c564b", "file": "#7f7f7f", "ack": "#1f77b4", "deliver": "#2ca02c"}
NAMES = {"im": "im-server (durable ack)", "mosquitto": "Mosquitto 2 WS (ack from memory)",
         "rss": "im-server (RSS)", "heap": "im-server (heap)",
         "resident": "jemalloc resident", "sqlite": "SQLite (C heap)", "file": "RSS of files (binary)", "ack": "send→ack P99", "deliver": "delivery P99"}


def fanout_point(n, j):
    return n, j.get("cpu_us_per_delivery")


def idle_point(n, j):
    rss = j.get("rss_after")
    if rss is None and j.get("rss_per_connection") is not None:
        rss = j["rss_per_connection"] * n
    return n, None if rss is None else rss / (1024 * 1024)


def load_point(n, j):
    offered = n * 10
    p99 = (j.get("ack_latency") or {}).get("p99")
    return offered, None if p99 is None else p99 / 1000


PLOTS = [
    ("fanout", fanout_point, "group size (members)", "server CPU per delivery (µs)",
     "CPU per delivery against group size, same deliveries per second", True, False),
    ("idle", idle_point, "idle authenticated connections", "server RSS (MiB)",
     "Server memory against idle connections", False, False),
    ("load", load_point, "offered one-to-one load (msg/s)", "send→ack P99 (ms, log scale)",
     "send→ack P99 against offered load", True, True),
]


def series(results, kind, point):
    """{server: [(x, y, passed)]} for one kind of run, sorted by x."""
    out = {}
    for path in glob.glob(os.path.join(results, f"{kind}-*-*.json")):
        m = re.match(rf"{kind}-(\w+)-(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        try:
            with open(path) as f:
                j = json.load(f)
        except (OSError, ValueError):
            continue
        x, y = point(int(m.group(2)), j)
        if y is None:
            continue
        out.setdefault(m.group(1), []).append((x, y, j.get("passed") is True))
    for pts in out.values():
        pts.sort()
    return out


def scale(lo, hi, log):
    """A function mapping [lo, hi] onto [0, 1], and the tick values."""
    if log and lo > 0 and hi / lo >= 10:
        a, b = math.log10(lo), math.log10(hi)
        ticks = [v * 10 ** e for e in range(math.floor(a), math.ceil(b) + 1)
                 for v in (1, 2, 5) if lo <= v * 10 ** e <= hi]
        return (lambda v: (math.log10(v) - a) / ((b - a) or 1)), ticks
    lo = 0.0
    hi = hi * 1.1 or 1.0
    step = 10 ** math.floor(math.log10(hi / 5))
    for m in (1, 2, 5, 10):
        if hi / (step * m) <= 6:
            step *= m
            break
    ticks = [i * step for i in range(int(hi / step) + 1)]
    return (lambda v: (v - lo) / (hi - lo)), ticks


def fmt(v):
    return f"{v:,.0f}" if v >= 10 else f"{v:g}"


def svg(kind, data, xlabel, ylabel, title, xlog, ylog):
    xs = [p[0] for pts in data.values() for p in pts]
    ys = [p[1] for pts in data.values() for p in pts]
    fx, xticks = scale(min(xs), max(xs), xlog)
    fy, yticks = scale(min(ys) if ylog else 0, max(ys), ylog)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x):
        return LEFT + fx(x) * pw

    def py(y):
        return TOP + ph - fy(y) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="13">{escape(title)}</text>']
    for t in xticks:
        x = px(t)
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + ph}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + ph + 15}" text-anchor="middle">{fmt(t)}</text>')
    for t in yticks:
        y = py(t)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + pw}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 15}" text-anchor="middle">{escape(xlabel)}</text>')
    out.append(f'<text transform="translate(16 {TOP + ph / 2}) rotate(-90)" '
               f'text-anchor="middle">{escape(ylabel)}</text>')
    failed = []
    for i, (server, pts) in enumerate(sorted(data.items())):
        color = COLORS.get(server, "#555")
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y, _ in pts)
        out.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y, ok in pts:
            fill = color if ok else "white"
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{fill}" '
                       f'stroke="{color}"><title>{escape(server)}: {fmt(x)} → {y:.2f}</title></circle>')
            if not ok:
                failed.append(f"{server} {fmt(x)}")
        ly = TOP + 10 + i * 32
        out.append(f'<line x1="{LEFT + pw + 10}" y1="{ly}" x2="{LEFT + pw + 30}" y2="{ly}" '
                   f'stroke="{color}" stroke-width="2"/>')
        words = NAMES.get(server, server).split(" (")
        out.append(f'<text x="{LEFT + pw + 34}" y="{ly + 4}">{escape(words[0])}</text>')
        if len(words) > 1:
            out.append(f'<text x="{LEFT + pw + 34}" y="{ly + 17}" fill="#666">'
                       f'({escape(words[1])}</text>')
    if failed:
        out.append(f'<text x="{LEFT + pw + 10}" y="{TOP + ph}" fill="#666">hollow: not passed</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n", failed


def soak(report_path, plots):
    """The soak's two plots from its JSON report; whether both were drawn."""
    try:
        with open(report_path) as f:
            j = json.load(f)
    except (OSError, ValueError) as e:
        print(f"plot: {report_path}: {e}", file=sys.stderr)
        return False
    ok = j.get("passed") is True
    samples = j.get("samples") or []
    minute = lambda s: s["end_secs"] / 60
    mib = lambda key: [(minute(s), s[key] / (1024 * 1024), ok) for s in samples
                       if s.get(key) is not None]
    memory = {"rss": mib("rss_bytes"), "resident": mib("heap_resident_bytes"),
              "heap": mib("heap_allocated_bytes"), "sqlite": mib("sqlite_bytes"), "file": mib("rss_file_bytes")}
    p99 = {k: [(minute(s), s[f"{f}_p99_us"] / 1000, ok) for s in samples if s.get(f"{f}_p99_us")]
           for k, f in (("ack", "send_to_ack"), ("deliver", "deliver"))}
    drawn = 0
    for name, data, ylabel, title in (
            ("soak-rss", memory, "MiB", "Soak: server RSS and heap (jemalloc allocated) over time"),
            ("soak-p99", p99, "P99 of the window (ms)", "Soak: P99 per window over time")):
        data = {k: v for k, v in data.items() if v}
        if not data:
            print(f"plot: no {name} data in {report_path}", file=sys.stderr)
            continue
        text, _ = svg(name, data, "minutes into the measured run", ylabel, title, False, False)
        path = os.path.join(plots, f"{name}.svg")
        with open(path, "w") as f:
            f.write(text)
        drawn += 1
        print(f"plot: {path}")
    return drawn == 2


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--soak":
        os.makedirs(sys.argv[3], exist_ok=True)
        sys.exit(0 if soak(sys.argv[2], sys.argv[3]) else 1)
    if len(sys.argv) != 3:
        sys.exit("usage: plot.py RESULTS_DIR PLOTS_DIR | plot.py --soak SOAK_JSON PLOTS_DIR")
    results, plots = sys.argv[1], sys.argv[2]
    os.makedirs(plots, exist_ok=True)
    drawn = 0
    for kind, point, xlabel, ylabel, title, xlog, ylog in PLOTS:
        data = series(results, kind, point)
        if not data:
            print(f"plot: no {kind} results in {results}", file=sys.stderr)
            continue
        text, failed = svg(kind, data, xlabel, ylabel, title, xlog, ylog)
        path = os.path.join(plots, f"{kind}.svg")
        with open(path, "w") as f:
            f.write(text)
        drawn += 1
        note = f" (not passed: {', '.join(failed)})" if failed else ""
        print(f"plot: {path}{note}")
    sys.exit(0 if drawn else 1)


if __name__ == "__main__":
    main()
