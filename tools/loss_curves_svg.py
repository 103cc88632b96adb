#!/usr/bin/env python3
"""Loss curves of csv_monitor runs as one SVG (no plotting library needed), and a table.

usage: tools/loss_curves_svg.py OUT.svg NAME=metrics.csv [NAME=metrics.csv ...]
Prints a Markdown table: each run's final loss (mean of the last 20 steps, and the last step)
and its difference from the first run's.
"""
import csv
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf"]


def read(path):
    steps, losses = [], []
    with open(path) as f:
        for row in csv.DictReader(f):
            steps.append(int(row["step"]))
            losses.append(float(row["loss"]))
    return steps, losses


def smooth(xs, k=10):
    out = []
    for i in range(len(xs)):
        w = xs[max(0, i - k + 1): i + 1]
        out.append(sum(w) / len(w))
    return out


def main():
    out = sys.argv[1]
    runs = [(a.split("=", 1)[0], read(a.split("=", 1)[1])) for a in sys.argv[2:]]
    # The legend sits right of the plot; widen the picture so the longest name fits (about 7 px
    # a character at 12 px sans-serif).
    R = 45 + 7 * max(len(name) for name, _ in runs)
    W, H, L, B, T = 490 + R, 400, 60, 40, 20
    max_step = max(s[-1] for _, (s, _) in runs)
    lo = min(min(smooth(l)) for _, (_, l) in runs)
    hi = max(max(smooth(l)) for _, (_, l) in runs)

    def x(s):
        return L + (W - L - R) * (s - 1) / max(1, max_step - 1)

    def y(v):
        return T + (H - T - B) * (hi - v) / (hi - lo)

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>']
    for i in range(6):
        v = lo + (hi - lo) * i / 5
        svg.append(f'<text x="{L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
        svg.append(f'<line x1="{L}" y1="{y(v):.1f}" x2="{W - R}" y2="{y(v):.1f}" stroke="#ddd"/>')
    for i in range(6):
        s = 1 + (max_step - 1) * i / 5
        svg.append(f'<text x="{x(s):.1f}" y="{H - B + 16}" text-anchor="middle">{int(s)}</text>')
    svg.append(f'<text x="{(L + W - R) / 2}" y="{H - 4}" text-anchor="middle">step</text>')
    svg.append(f'<text x="14" y="{T + 10}">loss (mean of 10 steps)</text>')
    for i, (name, (steps, losses)) in enumerate(runs):
        c = COLORS[i % len(COLORS)]
        pts = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in zip(steps, smooth(losses)))
        svg.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{pts}"/>')
        svg.append(f'<line x1="{W - R + 10}" y1="{T + 20 * i + 10}" x2="{W - R + 30}" y2="{T + 20 * i + 10}" stroke="{c}" stroke-width="2"/>')
        svg.append(f'<text x="{W - R + 35}" y="{T + 20 * i + 14}">{name}</text>')
    svg.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")

    base = sum(runs[0][1][1][-20:]) / 20
    print("| optimizer | final loss (mean of last 20 steps) | last step | vs first |")
    print("|---|---|---|---|")
    for name, (steps, losses) in runs:
        m = sum(losses[-20:]) / 20
        print(f"| {name} | {m:.4f} | {losses[-1]:.4f} | {100 * (m / base - 1):+.2f}% |")


if __name__ == "__main__":
    main()
