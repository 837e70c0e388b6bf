"""The continual-learning measures of an accuracy matrix, and the gate's decisions against what each candidate was.

R[i][j]: accuracy on skill j's fixed test set after the i-th skill was learned (rows and columns in the order the
skills arrived, 0-based here; b[j]: the base model's accuracy on skill j). As Lopez-Paz & Ranzato define them
(Gradient Episodic Memory, 2017), with T skills:
- average accuracy after skill t: the mean of R[t][j] over the skills seen so far, j <= t (ACC is its value at T);
- backward transfer, BWT = mean over j < T of R[T][j] - R[j][j]: what later learning did to earlier skills (below 0:
  forgetting);
- forward transfer, FWT = mean over j > 1 of R[j-1][j] - b[j]: what learning the earlier skills did for a skill not
  yet taught.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Matrix = Sequence[Sequence[float]]

LEARNED = 0.25  # a candidate learned its skill: its fixed-test accuracy there rose at least this much (4 of 16)
KEPT = 0.10  # and kept the others: none fell more than this


def seen_average(R: Matrix) -> list[float]:
    """After each skill t, the mean accuracy over skills 0..t."""
    return [sum(R[t][: t + 1]) / (t + 1) for t in range(len(R))]


def backward_transfer(R: Matrix) -> float:
    T = len(R)
    return sum(R[-1][j] - R[j][j] for j in range(T - 1)) / (T - 1) if T > 1 else 0.0


def forward_transfer(R: Matrix, base: Sequence[float]) -> float:
    T = len(R)
    return sum(R[j - 1][j] - base[j] for j in range(1, T)) / (T - 1) if T > 1 else 0.0


def summary(R: Matrix, base: Sequence[float]) -> dict[str, float | list[float]]:
    """ACC (the final average), the average after each skill, BWT and FWT."""
    average = seen_average(R)
    return {"acc": average[-1] if average else 0.0, "average_seen": average, "bwt": backward_transfer(R),
            "fwt": forward_transfer(R, base)}


@dataclass(frozen=True)
class Truth:
    """What a candidate really was, on the fixed test sets against the champion it would replace: whether it learned
    the skill it was taught (its accuracy there rose by LEARNED or more), improved on any seen skill (one the
    champion had missed, learned now), and kept every seen skill (none fell by more than KEPT). A good candidate,
    one the gate should promote, improved and kept, and was not trained to be bad."""

    learned: bool
    improved: bool
    kept: bool
    bad: bool  # a deliberately bad candidate (trained on shuffled answers)

    @property
    def good(self) -> bool:
        return self.improved and self.kept and not self.bad


def truth(champion: Sequence[float], candidate: Sequence[float], skill: int | None, seen: int,
          bad: bool = False) -> Truth:
    """The truth of one candidate: `skill` the index it was taught (None: none new), `seen` the skills that had
    arrived so far (the first `seen` columns)."""
    gains = [candidate[j] - champion[j] for j in range(seen)]
    learned = skill is not None and gains[skill] >= LEARNED
    return Truth(learned, any(g >= LEARNED for g in gains), all(g >= -KEPT for g in gains), bad)


def decisions_table(rows: Sequence[tuple[Truth, bool]]) -> dict[str, int]:
    """(truth, promoted?) per candidate -> the four counts: good promoted (right), good rejected (missed), bad
    rejected (right), bad promoted (wrong)."""
    table = {"good_promoted": 0, "good_rejected": 0, "bad_rejected": 0, "bad_promoted": 0}
    for t, promoted in rows:
        table[f"{'good' if t.good else 'bad'}_{'promoted' if promoted else 'rejected'}"] += 1
    return table
