"""The agent's strength over a run: the kept snapshots' scores (``bench/games.py --snapshots``), one line a row.

    python bench/games_curve.py bench/results/go-games-2026-12-07-2cores.jsonl go-snapshots.png

Each row of the JSON lines file that has ``snapshots`` is drawn: its score against the snapshots' opponent by the
minute of the run each snapshot was kept, with the 95% interval shaded, labelled by the row's ``--set``s.
"""

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows")
    parser.add_argument("png")
    args = parser.parse_args()
    with open(args.rows) as f:
        rows = [row for row in map(json.loads, f) if row.get("snapshots")]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for row in rows:
        points = [p for p in row["snapshots"] if "score" in p]
        minutes = [p["minute"] for p in points]
        label = f"{row['experiment']} {' '.join(row['sets']) or 'defaults'} ({row['date']})"
        ax.plot(minutes, [p["score"] for p in points], marker=".", label=label)
        ax.fill_between(minutes, [p["low"] for p in points], [p["high"] for p in points], alpha=0.15)
    opponents = sorted({p["opponent"] for row in rows for p in row["snapshots"] if "opponent" in p})
    ax.set_xlabel("minute of the run the snapshot was kept")
    ax.set_ylabel(f"score against {', '.join(opponents)} (95% interval)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.png, dpi=100)
    print(f"{len(rows)} runs drawn to {args.png}")


if __name__ == "__main__":
    main()
