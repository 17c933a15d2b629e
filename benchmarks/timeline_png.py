"""Draw an hvdlite timeline (the Chrome/Perfetto trace ``HOROVOD_TIMELINE`` writes) as a
picture: one row per tensor, one bar per phase, coloured by phase, on a common time axis.

It is a plain rendering of the trace's events, not Perfetto's or Chrome's viewer: it
writes a self-contained HTML page with an SVG drawing and, with ``--png``, screenshots
it with a headless Chromium (Debian: ``apt-get install chromium``). Nothing is fetched
from the network.

    python benchmarks/timeline_png.py TRACE.json --html out.html
    python benchmarks/timeline_png.py TRACE.json --png docs/images/timeline.png \\
        --step-of allreduce.fc2.bias --occurrence 10 --title "one training step"

The window is the whole trace, or ``--start-ms``/``--duration-ms`` (milliseconds from
the trace's start), or one step: from the ``--occurrence``-th start of the ``QUEUE``
phase of the tensor named by ``--step-of`` to its next start. ``--tensors REGEX`` keeps
the rows whose name matches. A trace whose job was killed before it closed the JSON
array is read too.
"""
from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Fixed colours for the phases hvdlite writes (hvdlite/csrc); others get one from the
# spare list, in order of appearance.
PHASE_COLOURS = {
    "QUEUE": "#c7d2e0",
    "NEGOTIATE": "#f2b134",  # every NEGOTIATE_<KIND>
    "CYCLE_ALLREDUCE": "#8e44ad",
    "MEMCPY_IN_FUSION_BUFFER": "#2ecc71",
    "MEMCPY_OUT_FUSION_BUFFER": "#16a085",
    "MPI_ALLREDUCE": "#e74c3c",
    "MPI_HIERARCHICAL_ALLREDUCE": "#c0392b",
    "MPI_LEADER_ALLREDUCE": "#a93226",
    "MPI_ALLGATHER": "#3498db",
    "MPI_HIERARCHICAL_ALLGATHER": "#2471a3",
    "MPI_BCAST": "#1abc9c",
    "MPI_ALLTOALL": "#d35400",
    "MPI_REDUCESCATTER": "#f1948a",
    "ADASUM": "#7d3c98",
    "NCCL_ALLREDUCE": "#76b900",
    "MEMCPY_DEVICE_TO_HOST": "#95a5a6",
    "MEMCPY_HOST_TO_DEVICE": "#7f8c8d",
}
SPARE_COLOURS = ["#5d6d7e", "#b7950b", "#117864", "#6c3483", "#784212", "#1b4f72"]


def load_trace(path: str) -> list[dict]:
    """The trace's events; tolerates the missing ``]`` of a trace that was not closed."""
    text = Path(path).read_text(encoding="utf-8").strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(text.rstrip(",\n ") + "\n]")


def colour_of(phase: str, spare: dict[str, str]) -> str:
    if phase.startswith("NEGOTIATE_"):
        return PHASE_COLOURS["NEGOTIATE"]
    if phase in PHASE_COLOURS:
        return PHASE_COLOURS[phase]
    if phase not in spare:
        spare[phase] = SPARE_COLOURS[len(spare) % len(SPARE_COLOURS)]
    return spare[phase]


def step_window(events: list[dict], names: dict[int, str], tensor: str,
                occurrence: int) -> tuple[float, float]:
    """(start, end) in µs: the ``occurrence``-th QUEUE start of ``tensor`` to the next."""
    starts = sorted(e["ts"] for e in events
                    if e.get("ph") == "X" and e["name"] == "QUEUE" and names.get(e["pid"]) == tensor)
    if len(starts) < occurrence + 2:
        sys.exit(f"{tensor!r} has {len(starts)} QUEUE phases in the trace; --occurrence "
                 f"{occurrence} needs {occurrence + 2}")
    return starts[occurrence] - 20.0, starts[occurrence + 1] - 20.0


def render_html(events: list[dict], start_us: float | None, end_us: float | None,
                tensors: str | None, title: str, width: int) -> tuple[str, int]:
    """The page and its height in pixels."""
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    phases = [e for e in events if e.get("ph") == "X"]
    marks = [e for e in events if e.get("ph") == "i"]
    lo = min(e["ts"] for e in phases) if start_us is None else start_us
    hi = max(e["ts"] + e.get("dur", 0) for e in phases) if end_us is None else end_us
    keep = re.compile(tensors) if tensors else None
    shown = [e for e in phases if e["ts"] + e.get("dur", 0) >= lo and e["ts"] <= hi
             and (keep is None or keep.search(names.get(e["pid"], "")))]
    rows = sorted({e["pid"] for e in shown})
    label_w, row_h, top, axis_h = 330, 22, 40, 30
    plot_w = width - label_w - 20
    legend_rows = 0
    spare: dict[str, str] = {}
    legend = []
    for e in sorted(shown, key=lambda e: e["ts"]):
        key = "NEGOTIATE_*" if e["name"].startswith("NEGOTIATE_") else e["name"]
        if key not in [k for k, _ in legend]:
            legend.append((key, colour_of(e["name"], spare)))
    per_line = max(1, plot_w // 230)
    legend_rows = (len(legend) + per_line - 1) // per_line
    height = top + len(rows) * row_h + axis_h + 20 + legend_rows * 22 + 10

    def x(t: float) -> float:
        return label_w + (t - lo) / (hi - lo) * plot_w

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="DejaVu Sans, sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="22" font-size="15" font-weight="bold">{html.escape(title)}</text>']
    for i, pid in enumerate(rows):
        y = top + i * row_h
        if i % 2:
            svg.append(f'<rect x="0" y="{y}" width="{width}" height="{row_h}" fill="#f6f7f9"/>')
        svg.append(f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end">'
                   f'{html.escape(names.get(pid, str(pid)))}</text>')
    for e in marks:  # CYCLE_START marks (--timeline-mark-cycles), as thin lines
        if lo <= e["ts"] <= hi:
            svg.append(f'<line x1="{x(e["ts"]):.1f}" y1="{top}" x2="{x(e["ts"]):.1f}" '
                       f'y2="{top + len(rows) * row_h}" stroke="#bbb" stroke-dasharray="2,3"/>')
    order = {pid: i for i, pid in enumerate(rows)}
    # QUEUE (and negotiation) spans hold the others: draw them first, lower and fainter.
    for e in sorted(shown, key=lambda e: (e["name"] != "QUEUE", not e["name"].startswith("NEGOTIATE_"))):
        y = top + order[e["pid"]] * row_h
        x0, x1 = x(max(e["ts"], lo)), x(min(e["ts"] + e.get("dur", 0), hi))
        w = max(x1 - x0, 1.5)
        inset = 3 if e["name"] == "QUEUE" else 6 if e["name"].startswith("NEGOTIATE_") else 5
        tip = f'{e["name"]}: {e.get("dur", 0)} µs'
        svg.append(f'<rect x="{x0:.2f}" y="{y + inset}" width="{w:.2f}" height="{row_h - 2 * inset}" '
                   f'fill="{colour_of(e["name"], spare)}"><title>{html.escape(tip)}</title></rect>')
    # Time axis.
    axis_y = top + len(rows) * row_h + 6
    svg.append(f'<line x1="{label_w}" y1="{axis_y}" x2="{label_w + plot_w}" y2="{axis_y}" stroke="#333"/>')
    span = hi - lo
    step = next(s for s in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000,
                            50000, 100000, 200000, 500000, 1000000, 10**7, 10**8)
                if span / s <= 10)
    t = 0.0
    while t <= span + 1e-9:
        xt = label_w + t / span * plot_w
        label = f"{t / 1000:g} ms" if step >= 100 else f"{t:g} µs"
        svg.append(f'<line x1="{xt:.1f}" y1="{axis_y}" x2="{xt:.1f}" y2="{axis_y + 5}" stroke="#333"/>')
        svg.append(f'<text x="{xt:.1f}" y="{axis_y + 18}" text-anchor="middle">{label}</text>')
        t += step
    # Legend.
    ly = axis_y + 36
    for k, (key, colour) in enumerate(legend):
        lx = label_w + (k % per_line) * 230
        yy = ly + (k // per_line) * 22
        svg.append(f'<rect x="{lx}" y="{yy - 10}" width="14" height="12" fill="{colour}"/>')
        svg.append(f'<text x="{lx + 20}" y="{yy}">{html.escape(key)}</text>')
    svg.append("</svg>")
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><style>body{margin:0}</style>"
            f"</head><body>{''.join(svg)}</body></html>")
    return page, height


def screenshot(page: Path, png: Path, width: int, height: int) -> None:
    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is None:
        sys.exit("no Chromium found for --png (Debian: apt-get install chromium); use --html")
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},{height}", f"--screenshot={png.resolve()}",
                    page.resolve().as_uri()], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--html", help="write the page here")
    p.add_argument("--png", help="screenshot the page into this PNG (needs Chromium)")
    p.add_argument("--start-ms", type=float, help="window start, ms from the trace's start")
    p.add_argument("--duration-ms", type=float, help="window length in ms")
    p.add_argument("--step-of", metavar="TENSOR", help="window: one step of this tensor's QUEUE phases")
    p.add_argument("--occurrence", type=int, default=0, help="which step (0: the first)")
    p.add_argument("--tensors", metavar="REGEX", help="only rows whose tensor name matches")
    p.add_argument("--title", default="hvdlite timeline")
    p.add_argument("--width", type=int, default=1200)
    args = p.parse_args(argv)
    if not args.html and not args.png:
        p.error("give --html, --png or both")
    events = load_trace(args.trace)
    start = end = None
    if args.step_of:
        names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
        start, end = step_window(events, names, args.step_of, args.occurrence)
    elif args.start_ms is not None:
        start = args.start_ms * 1000
        end = None if args.duration_ms is None else start + args.duration_ms * 1000
    page, height = render_html(events, start, end, args.tensors, args.title, args.width)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.html) if args.html else Path(tmp) / "timeline.html"
        out.write_text(page, encoding="utf-8")
        if args.png:
            screenshot(out, Path(args.png), args.width, height)
    return 0


if __name__ == "__main__":
    sys.exit(main())
