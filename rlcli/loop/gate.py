"""The gate's arithmetic (pure): how a candidate compares with the champion, slice by slice, and the decision.

Both models answer the same problems; a problem's score is the share of its k answers that were right (0 or 1 for
one greedy answer). A comparison's gain is the mean over problems of candidate minus champion.

Per slice (`gate = "auto"`, the default). Each slice's interval comes from an exact sign-flip test: if the two
models did equally well, each problem's difference would be as likely to carry either sign (which model is which
is a coin toss), and the test counts, exactly (`upper_tail`), the sign assignments whose total reaches the one
observed. The interval holds every shift of the gain, on a grid of 1/(k * GRID), that this test does not reject at
either end. At 0 the test is exact (with 0/1 scores it is McNemar's exact test), and the gate reads the interval
only there: a slice gained when its interval lies above 0, and fell when it lies below 0 and its drop is larger
than the margin. Its ends away from 0 assume every problem's difference moves alike, which 0/1 scores meet only
roughly: read them as a description (a slice whose problems all changed the same way gets a point). The test has
a floor: no assignment is rarer than all signs positive, probability 2^-w for w changed problems, so a slice shows
a gain only when at least `needed` of its problems improve and none fall: `power` says so before any training.

The error rate across slices (Bonferroni): with S slices compared, each interval is at confidence
1 - (1 - confidence) / S, so all S hold together with probability at least `confidence`. The gate promotes when
a slice new since the champion gained and no slice fell: of slices on which the two models do equally well, it
credits a gain or blames a drop on any, at most 1 - confidence of the time (5% at 0.95), however many there are.

Pooled (`gate = "pooled"`, the rule before slices): all held-out problems in one paired bootstrap interval
(percentile, `resamples` resamplings of the problems); promote when it lies above 0 and the regression set's mean
falls by no more than the margin.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

GRID = 50  # interval ends fall on multiples of 1/(k * GRID): finer than the two decimals they are shown with
EXACT_LIMIT = 1 << 17  # sums of signed magnitudes up to this are counted exactly; beyond, a normal approximation


@dataclass(frozen=True)
class Comparison:
    champion: float
    candidate: float
    gain: float  # candidate - champion, mean over problems
    low: float
    high: float
    n: int
    confidence: float = 0.0  # of the interval (0: not recorded, as in ledgers written before slices)

    def describe(self) -> str:
        return f"{self.champion:.3f} -> {self.candidate:.3f}, gain {self.gain:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


@dataclass(frozen=True)
class Slice(Comparison):
    """One slice's comparison: its name, and whether its held-out problems arrived after the champion was made
    (new: its gain can promote a candidate; every slice, new or not, must not fall beyond the margin)."""

    name: str = ""
    new: bool = False

    def describe(self) -> str:
        return f"{self.name!r} {super().describe()} n={self.n}"

    def brief(self) -> str:
        return f"{self.name!r} {self.gain:+.2f} [{self.low:+.2f}, {self.high:+.2f}] n={self.n}"

    def gained(self) -> bool:
        """New, and its interval lies above 0 (the test at 0 rejects "no better")."""
        return self.new and self.low > 0

    def fell(self, margin: float) -> bool:
        """Its interval lies below 0 (the test at 0 rejects "no worse"), and it fell by more than the margin."""
        return self.high < 0 and self.gain < -margin


# --- the pooled rule ----------------------------------------------------------------------------


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
    return Comparison(sum(champion) / n, sum(candidate) / n, sum(diffs) / n, low, high, n, confidence)


def decide(heldout: Comparison, regression: Comparison, margin: float) -> tuple[bool, str]:
    """(promote?, why) for the pooled rule; a rejection names every rule the candidate failed, so a candidate
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


# --- the exact sign-flip interval ---------------------------------------------------------------


def upper_tail(magnitudes: Sequence[int], observed: int) -> float:
    """P(sum of s_i * m_i >= observed) for independent fair signs s_i and integer magnitudes m_i >= 0: the
    distribution of the signed sum built one magnitude at a time (exact), or its normal approximation once the
    sums span more than EXACT_LIMIT values (slices of hundreds of problems, where it is close)."""
    mags = [abs(m) for m in magnitudes if m]
    if mags:
        common = math.gcd(*mags)
        mags, observed = [m // common for m in mags], math.ceil(observed / common)
    total = sum(mags)
    if observed > total:
        return 0.0
    if observed <= -total:
        return 1.0
    if 2 * total + 1 > EXACT_LIMIT:
        return 0.5 * math.erfc((observed - 0.5) / math.sqrt(2 * sum(m * m for m in mags)))
    import numpy as np

    dist = np.zeros(2 * total + 1)  # dist[total + x] = P(signed sum = x)
    dist[total] = 1.0
    for m in mags:
        dist = 0.5 * (np.concatenate((np.zeros(m), dist[:-m])) + np.concatenate((dist[m:], np.zeros(m))))
    return float(dist[total + observed:].sum())


def _grid_diffs(champion: Sequence[float], candidate: Sequence[float], k: int) -> list[int]:
    """Each problem's difference in answers out of k (the scores are shares of k answers)."""
    return [round((b - a) * k) for a, b in zip(champion, candidate, strict=True)]


def _rejects_above(diffs: list[int], j: int, tail: float) -> bool:
    """Whether a gain of j / (k * GRID) is rejected in favour of a larger one (diffs counted in answers)."""
    shifted = [GRID * d - j for d in diffs]
    return upper_tail(shifted, sum(shifted)) <= tail


def _rejects_below(diffs: list[int], j: int, tail: float) -> bool:
    shifted = [GRID * d - j for d in diffs]
    return upper_tail(shifted, -sum(shifted)) <= tail


def _first(lo: int, hi: int, rejected) -> int:
    """The least j in (lo, hi] that is not rejected, given lo rejected and hi not (the test's p-value grows with
    the distance between the shift and the observed gain, so one crossing)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if rejected(mid) else (lo, mid)
    return hi


def sign_flip(champion: Sequence[float], candidate: Sequence[float], confidence: float = 0.95,
              k: int = 1) -> Comparison:
    """The gain and its exact interval at `confidence` (two-sided): the shifts on the grid that the sign-flip test
    does not reject. k: answers per problem (scores are multiples of 1/k). A slice too small to show anything gets
    [-1, 1]; an unchanged one large enough gets [0, 0] (no problem moved, so no shift of them all fits)."""
    if len(champion) != len(candidate):
        raise ValueError("paired scores need the same problems for both models")
    n = len(champion)
    if n == 0:
        return Comparison(0.0, 0.0, 0.0, 0.0, 0.0, 0, confidence)
    diffs, tail, top = _grid_diffs(champion, candidate, k), (1 - confidence) / 2, k * GRID
    gain = sum(diffs) / (n * k)
    at = GRID * sum(diffs) / n  # the observed gain on the grid's scale
    low = -top if not _rejects_above(diffs, -top, tail) else _first(
        -top, math.ceil(at), lambda j: _rejects_above(diffs, j, tail))
    high = top if not _rejects_below(diffs, top, tail) else -_first(
        -top, -math.floor(at), lambda j: _rejects_below(diffs, -j, tail))
    return Comparison(sum(champion) / n, sum(candidate) / n, gain, min(low / top, gain), max(high / top, gain), n,
                      confidence)


# --- slices -------------------------------------------------------------------------------------


def each_confidence(confidence: float, slices: int) -> float:
    """Bonferroni: the confidence of each of `slices` intervals that hold together with `confidence`."""
    return 1 - (1 - confidence) / max(slices, 1)


def compare_slices(scores: dict[str, tuple[list[float], list[float]]], new: set[str], confidence: float = 0.95,
                   k: int = 1) -> list[Slice]:
    """Each slice's comparison, {name: (champion's scores, candidate's)}, at the confidence that makes all of them
    hold together with `confidence`; `new`: the slices whose gain can promote."""
    each = each_confidence(confidence, len(scores))
    return [Slice(**vars(sign_flip(a, b, each, k)), name=name, new=name in new)
            for name, (a, b) in sorted(scores.items())]


def decide_slices(slices: Sequence[Slice], margin: float, confidence: float = 0.95) -> tuple[bool, str]:
    """(promote?, why): promote when a new slice gained (its interval above 0) and no slice fell (its interval
    below 0, its drop larger than the margin); a rejection names every rule the candidate failed, and each slice
    that fell."""
    if not slices:
        return False, "no problems to compare on"
    new = [s for s in slices if s.new]
    gained = [s for s in new if s.gained()]
    fell = [s for s in slices if s.fell(margin)]
    together = (f"{len(slices)} slice{'s' * (len(slices) != 1)} at {slices[0].confidence:.2%} each, "
                f"{confidence:.0%} together")
    failed = []
    if not new:
        failed.append("no slice is new since the champion: nothing can show a gain")
    elif not gained:
        failed.append("no new slice gained beyond its interval (" + "; ".join(s.brief() for s in new) + ")")
    failed += [f"slice {s.name!r} fell beyond the margin {margin:g}: {s.champion:.2f} -> {s.candidate:.2f}, "
               f"{s.brief().removeprefix(repr(s.name) + ' ')}" for s in fell]
    if failed:
        return False, "; ".join(failed) + f" ({together})"
    return True, ("gained: " + "; ".join(s.brief() for s in gained) +
                  f"; no slice fell beyond the margin {margin:g} ({together})")


# --- power before compute -----------------------------------------------------------------------


def needed(confidence: float) -> int:
    """The fewest problems that must all improve (none falling) for an interval at `confidence` to clear 0: the
    least w with 2^-w at most its one tail."""
    return math.ceil(math.log2(2 / (1 - confidence)) - 1e-9)


@dataclass(frozen=True)
class Power:
    """What one slice can show before any training: n problems, of which `open` could still improve (the
    champion's known scores below 1; n when unknown), at the per-slice confidence."""

    name: str
    n: int
    open: int
    new: bool
    needed: int
    k: int = 1

    @property
    def smallest_gain(self) -> float:
        """The least gain its interval can clear 0 with: `needed` problems each one answer better."""
        return self.needed / (max(self.n, 1) * self.k)

    @property
    def blind(self) -> bool:
        return self.needed > self.open


def power(slices: dict[str, tuple[int, int, bool]], confidence: float = 0.95, k: int = 1) -> list[Power]:
    """Per slice {name: (problems, problems that could improve, new?)}: what it can show at `confidence` over all
    these slices (each at the Bonferroni confidence)."""
    need = needed(each_confidence(confidence, len(slices)))
    return [Power(name, n, open_, new, need, k) for name, (n, open_, new) in sorted(slices.items())]
