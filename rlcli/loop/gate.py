"""The gate's arithmetic (pure): a paired bootstrap interval of candidate minus champion, and the decision.

Both models answer the same problems; each problem gives a pair of scores (0 or 1 under --match). The gain is
the mean of the per-problem differences; its interval is the percentile interval of that mean over
`resamples` resamplings of the problems with replacement (a paired bootstrap: the pairing cancels how hard
each problem is). Auto gate: promote only if the held-out interval lies above 0 and the regression score
drops by no more than the margin.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Comparison:
    champion: float
    candidate: float
    gain: float  # candidate - champion, mean over problems
    low: float
    high: float
    n: int

    def describe(self) -> str:
        return f"{self.champion:.3f} -> {self.candidate:.3f}, gain {self.gain:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


def paired_bootstrap(champion: list[float], candidate: list[float], confidence: float = 0.95,
                     resamples: int = 2000, seed: int = 0) -> Comparison:
    if len(champion) != len(candidate):
        raise ValueError("paired scores need the same problems for both models")
    n = len(champion)
    if n == 0:
        return Comparison(0.0, 0.0, 0.0, 0.0, 0.0, 0)
    diffs = [b - a for a, b in zip(champion, candidate, strict=True)]
    rng = random.Random(seed)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    tail = (1 - confidence) / 2
    low = means[int(tail * (resamples - 1))]
    high = means[int(round((1 - tail) * (resamples - 1)))]
    return Comparison(sum(champion) / n, sum(candidate) / n, sum(diffs) / n, low, high, n)


def decide(heldout: Comparison, regression: Comparison, margin: float) -> tuple[bool, str]:
    """(promote?, why) for the auto gate; a rejection names every rule the candidate failed, so a candidate
    that both gained too little and forgot is recorded as doing both."""
    if heldout.n == 0:
        return False, "no held-out problems to compare on"
    failed = []
    if heldout.low <= 0:
        failed.append(f"held-out gain {heldout.gain:+.3f} is not above 0 beyond its interval [{heldout.low:+.3f}, "
                      f"{heldout.high:+.3f}]")
    if regression.n and regression.gain < -margin:
        failed.append(f"regression score fell {-regression.gain:.3f} ({regression.champion:.3f} -> "
                      f"{regression.candidate:.3f}), more than the margin {margin:g}")
    if failed:
        return False, "; ".join(failed)
    kept = f"; regression {regression.gain:+.3f} (margin {margin:g})" if regression.n else "; no regression set"
    return True, f"held-out gain {heldout.gain:+.3f} [{heldout.low:+.3f}, {heldout.high:+.3f}]{kept}"
