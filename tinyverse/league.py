"""Games between sides and the ratings they imply: a game's result as players and eval store it
(the agent's params version against the opponent its env names in ``info["opponent"]``), Elo by
a Bradley-Terry fit, a match's score with its 95% interval, and the weights of a draw towards the
opponents the agent loses to."""

import math
import re
from typing import NamedTuple

import numpy as np

NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")  # random, mcts:200, gnugo:1, v120, a snapshot's name
PRIOR = 1.0  # games of a virtual draw against a side of rating 0 each side gets: no rating infinite
ITERATIONS = 200  # of the fit's minorize-maximize steps
BINS = 50  # pooled(): at most about this many groups of versions
VERSION_RE = re.compile(r"v([0-9]+)")


def opponent(info) -> str | None:
    """The opponent an env's step ``info`` names (a short name), None if it names none or junk."""
    name = info.get("opponent") if isinstance(info, dict) else None
    return name if isinstance(name, str) and NAME_RE.fullmatch(name) else None


def result(version: int | None, versus: str, outcome: float, when: float) -> dict:
    """The record of a game: side ``vN`` against ``versus``, scored 1 (won), 0.5 or 0 by the sign of
    the agent's return ``outcome``."""
    score = 1.0 if outcome > 0 else 0.5 if outcome == 0 else 0.0
    return {"time": when, "side": f"v{version or 0}", "opponent": versus, "score": score}


def games(records: list[dict]) -> list[tuple[str, str, float]]:
    """(side, opponent, score) of each game record that reads as one; junk ones are skipped."""
    found = []
    for r in records:
        side = r.get("side")
        versus = r.get("opponent")
        score = r.get("score")
        names = [n for n in (side, versus) if isinstance(n, str) and NAME_RE.fullmatch(n)]
        if len(names) == 2 and side != versus and score in (0.0, 0.5, 1.0):
            found.append((side, versus, float(score)))
    return found


class Rating(NamedTuple):
    name: str
    elo: float  # 0: the anchor (random, if it played), else the side with the most games
    games: int
    score: float  # its mean score over those games


def ratings(played: list[tuple[str, str, float]], anchor: str = "random") -> list[Rating]:
    """Elo of every side of ``played`` (``games``'), highest first: a Bradley-Terry fit (draws
    half a win each) by minorize-maximize, each side with a virtual draw against rating 0."""
    names = sorted({n for side, versus, _ in played for n in (side, versus)})
    if not names:
        return []
    index = {n: i for i, n in enumerate(names)}
    a = np.array([index[side] for side, _, _ in played])
    b = np.array([index[versus] for _, versus, _ in played])
    s = np.array([score for _, _, score in played])
    wins = np.bincount(a, s, len(names)) + np.bincount(b, 1 - s, len(names)) + PRIOR / 2
    counts = np.bincount(a, minlength=len(names)) + np.bincount(b, minlength=len(names))
    strength = np.ones(len(names))
    for _ in range(ITERATIONS):
        pair = 1.0 / (strength[a] + strength[b])
        spent = np.bincount(a, pair, len(names)) + np.bincount(b, pair, len(names))
        strength = wins / (spent + PRIOR / (strength + 1.0))
    elo = 400 * np.log10(strength)
    zero = index[anchor] if anchor in index else int(np.argmax(counts))
    scores = (wins - PRIOR / 2) / np.maximum(counts, 1)
    found = [
        Rating(n, float(elo[i] - elo[zero]), int(counts[i]), float(scores[i]))
        for n, i in index.items()
    ]
    return sorted(found, key=lambda r: -r.elo)


def pooled(played: list[tuple[str, str, float]]) -> list[tuple[str, str, float]]:
    """``played`` with consecutive params versions pooled into groups (``v12-v40``) of at least 10
    games and about 1/BINS of the versions' games each, so that thousands of versions of a game
    or two each rate as a curve, not noise; a game within one group is left out."""
    counts = {}
    for name in (n for side, versus, _ in played for n in (side, versus)):
        if VERSION_RE.fullmatch(name):
            counts[name] = counts.get(name, 0) + 1
    least = max(10, sum(counts.values()) // BINS)
    ordered = sorted(counts, key=lambda n: int(n[1:]))
    groups = []  # consecutive versions; one of at least ``least`` games stands alone
    for name in ordered:
        if not groups or counts[name] >= least or sum(counts[m] for m in groups[-1]) >= least:
            groups.append([name])
        else:
            groups[-1].append(name)
    group = {}
    for members in groups:
        label = members[0] if len(members) == 1 else f"{members[0]}-{members[-1]}"
        group.update(dict.fromkeys(members, label))
    renamed = [(group.get(side, side), group.get(versus, versus), s) for side, versus, s in played]
    return [(side, versus, s) for side, versus, s in renamed if side != versus]


def interval(score: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's 95% interval of a mean score ``score`` over ``n`` games (draws count half)."""
    if n == 0:
        return 0.0, 1.0
    middle = (score + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(score * (1 - score) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, middle - half), min(1.0, middle + half)


def match_line(versus: str, scores: list[float]) -> str:
    """A match against ``versus`` in a line: wins, draws, losses, the score and its interval."""
    won, drawn = scores.count(1.0), scores.count(0.5)
    mean = sum(scores) / len(scores)
    low, high = interval(mean, len(scores))
    tally = f"{won} won, {drawn} drawn, {len(scores) - won - drawn} lost of {len(scores)}"
    return f"against {versus}: {tally}: score {mean:.3f} (95% interval {low:.3f}-{high:.3f})"


def weights(names: list[str], played: list[tuple[str, str, float]]) -> list[float]:
    """How often to draw each of ``names`` as the opponent: (1 - p)^2, p the agent's mean score
    against it (one virtual draw each: 0.25 for one never played), so those it loses to come
    most, those it always beats almost never."""
    score = {n: [0.5, 1] for n in names}
    for _, versus, s in played:
        if versus in score:
            score[versus][0] += s
            score[versus][1] += 1
    return [(1 - total / n) ** 2 + 1e-3 for total, n in score.values()]


def table(played: list[tuple[str, str, float]], rows: int = 12) -> list[str]:
    """``info``'s ratings: the sides with the most games (at most ``rows``), highest Elo first;
    versions pooled (:func:`pooled`)."""
    found = ratings(pooled(played))
    shown = sorted(sorted(found, key=lambda r: -r.games)[:rows], key=lambda r: -r.elo)
    anchor = "random" if any(r.name == "random" for r in found) else "the side with the most games"
    lines = [f"  ratings   Elo of {len(found)} sides over {len(played):,} games (0: {anchor})"]
    for r in shown:
        lines.append(
            f"            {r.name:<12} {r.elo:+7.0f}  {r.games:,} games, score {r.score:.2f}"
        )
    return lines
