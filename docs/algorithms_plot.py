"""Draw docs/algorithms.png: what each algorithm admits of the same bursty traffic.

Run with the ``docs`` extra installed: ``python docs/algorithms_plot.py``. It drives the
pure step functions (as the memory backend does, one limit per algorithm), so the picture
is the real behaviour, not a sketch.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sluice.algorithms import ALGORITHMS, Limit  # noqa: E402

RATE, PERIOD = 5, 5  # 5 requests per 5 s (1/s); buckets and GCRA allow bursts of 5
OUT = Path(__file__).with_name("algorithms.png")


def traffic() -> list[float]:
    """Arrival times: a burst, a fast stream, a burst either side of a window edge, a trickle."""
    times = [1.0] * 8
    times += [4.0 + 0.25 * i for i in range(16)]
    times += [9.7] * 5 + [10.1] * 5
    times += [14.0 + 0.8 * i for i in range(14)]
    return times


def run(algorithm: str, times: list[float]) -> list[tuple[float, bool, float]]:
    """(time, admitted, delay) per request."""
    limit = Limit(RATE, PERIOD, ALGORITHMS[algorithm], burst=RATE)
    state = None
    result = []
    for t in times:
        new, outcome = limit.algorithm.step(state, limit, t, 1)
        if outcome.allowed or limit.algorithm.counts_refused:  # fixed windows count every hit
            state = new
        result.append((t, outcome.allowed, outcome.delay_s))
    return result


def main() -> None:
    times = traffic()
    fig, (lanes, totals) = plt.subplots(
        2, 1, figsize=(11, 8.5), height_ratios=[3, 2], sharex=True, constrained_layout=True
    )
    for row, algorithm in enumerate(ALGORITHMS):
        y0 = len(ALGORITHMS) - 1 - row
        seen: dict[float, int] = {}
        admitted_total, xs, ys = 0, [0.0], [0]
        for t, allowed, delay in run(algorithm, times):
            k = seen[t] = seen.get(t, -1) + 1  # stack simultaneous requests
            y = y0 - 0.35 + 0.07 * (k % 11)
            if allowed:
                lanes.plot(t, y, "o", color="tab:green", markersize=5)
                if delay:
                    # The shaper releases it later: an arrow to when it leaves the queue.
                    lanes.plot([t, t + delay], [y, y], color="tab:green", alpha=0.35, lw=1)
                    lanes.plot(t + delay, y, "|", color="tab:green", markersize=6)
                admitted_total += 1
            else:
                lanes.plot(t, y, "x", color="tab:red", markersize=5)
            xs.append(t)
            ys.append(admitted_total)
        # Widths shrink down the list so lines that coincide (the buckets here) stay visible.
        totals.step(
            xs,
            ys,
            where="post",
            label=f"{algorithm} ({admitted_total} admitted)",
            lw=4.2 - 0.6 * row,
            alpha=0.85,
        )
    lanes.set_yticks(range(len(ALGORITHMS)), list(reversed(ALGORITHMS)))
    lanes.set_ylim(-0.6, len(ALGORITHMS) - 0.4)
    for edge in range(0, 26, PERIOD):
        lanes.axvline(edge, color="grey", lw=0.5, ls=":")
    lanes.set_title(
        f"The same traffic against {RATE} requests per {PERIOD} s (burst {RATE})\n"
        "green dot: admitted, red x: refused; leaky_bucket's lines run to when a hit leaves"
        " the queue"
    )
    offered = list(range(len(times) + 1))
    totals.step([0.0, *times], offered, where="post", color="black", ls=":", label="offered")
    totals.plot(
        [0, 25], [RATE, RATE + 25 * RATE / PERIOD], color="grey", lw=0.8, label="burst + rate"
    )
    totals.set_xlabel("time (s); dotted lines: fixed-window edges")
    totals.set_ylabel("admitted so far")
    totals.legend(loc="upper left", fontsize=8)
    totals.set_xlim(0, 25.5)
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
