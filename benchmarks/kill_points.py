"""Kill points for benchmarks/kill_loop.py, drawn from a seed, and the watcher that lands them.

A kill point is (stage, event, delay, signal, target): `target` (the `rlcli loop` command or the SkyRL server
under it) gets `signal` `delay` seconds after the `event`-th progress line the command printed in `stage`. The
stage of a line is read from the command's own output (the `rlcli loop:` lines that open each stage; a trainer's
lines belong to the stage that started it), so nothing in rlcli knows it is being killed, and a failure replays
from its seed: the same points in the same order (where a point lands within its stage depends on the machine's
speed; the receipt records where each one did).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rlcli.server import private

# (the line that opens a stage, the stage): `rlcli loop run` prints these, in this order, as it goes
OPENERS = [(re.compile(r"iteration \d+: (\d+ new trace file|resuming after)"), "ingest"),
           (re.compile(r"iteration \d+: ingested "), "split"),
           (re.compile(r"iteration \d+: \d+ to train, \d+ held out"), "power"),
           (re.compile(r"iteration \d+: (\w+) from .* -> "), "train:{0}"),
           (re.compile(r"iteration \d+: evaluating "), "scoring"),
           (re.compile(r"iteration \d+: held-out "), "gate"),
           (re.compile(r"exporting .* to "), "export"),
           (re.compile(r"moving the champion alias to |champion -> "), "promotion")]
# Where the seconds after an event should land a kill inside its stage (ingest and split take milliseconds; a
# promotion is the alias's transaction, the link's rename and the hook, which the harness's takes HOOK_S to run; a
# rollback's first line comes before its export, a few seconds).
HOOK_S = 0.5
DELAYS = {"ingest": 0.15, "split": 0.15, "power": 0.5, "scoring": 3.0, "gate": 0.3, "export": 2.0,
          "promotion": 0.8 * HOOK_S, "rollback": 1.5}
TRAIN_DELAY = 2.0
EVENTS = {"train": 4, "scoring": 2}  # how many of a stage's lines a point may wait for (the rest: its first)


@dataclass
class KillPoint:
    stage: str
    event: int  # -1: its stage had fewer lines; it came after the stage's last one
    delay: float
    signal: str
    target: str  # "loop" (the rlcli loop command, its process group) or "server" (every SkyRL process)
    landed: str | None = None  # the stage the command was in when the signal went (None: not reached)
    line: str = ""  # the line it came after
    command: str = ""
    outcome: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        return f"{self.target} {self.signal} at {self.stage} event {self.event} +{self.delay:.2f}s"

    def record(self) -> dict[str, Any]:
        return asdict(self)


def draw(rng: random.Random, stages: list[str], server_share: float) -> KillPoint:
    """One point: the stage from the shuffled cycle the caller keeps, the rest from rng."""
    stage = stages.pop()
    kind = stage.split(":")[0]
    delay = round(rng.uniform(0, DELAYS.get(kind, TRAIN_DELAY)), 3)
    event = rng.randrange(EVENTS.get(kind, 1))
    target = "server" if kind in ("train", "scoring", "export") and rng.random() < server_share else "loop"
    sig = "SIGKILL" if target == "server" or rng.random() < 0.6 else "SIGTERM"
    return KillPoint(stage, event, delay, sig, target)


def stage_of(line: str, current: str, command: str) -> str:
    if command == "rollback":
        return "rollback"
    text = line.removeprefix("rlcli loop: ")
    for pattern, stage in OPENERS:
        if found := pattern.search(text):
            return stage.format(*found.groups())
    return current


def fresh(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """`rlcli ARGS` in a fresh process in a session of its own, its stderr piped as text, its stdout dropped: how
    the harness starts each command (the test suite forks them from its zygote instead, tests/faults)."""
    return subprocess.Popen([*private.RLCLI, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, cwd=private.PACKAGE_PARENT)


class Watched:
    """An `rlcli loop` command (its arguments after `rlcli`, started by `spawn`) in its own process group whose
    stderr is read line by line; with a kill point, `kill` runs when the point's event has come and its delay
    passed."""

    def __init__(self, args: list[str], env: dict[str, str], command: str, point: KillPoint | None, kill,
                 spawn: Callable[[list[str], dict[str, str]], Any] = fresh):
        self.command, self.point, self.kill = command, point, kill
        self.lines: list[str] = []
        self.stage, self.seen = "start", 0
        self.proc = spawn(args, env)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            stage = stage_of(line.strip(), self.stage, self.command)
            p = self.point if self.point is not None and self.point.landed is None else None
            if stage != self.stage:
                ended = p is not None and self.stage == p.stage
                self.stage, self.seen = stage, 0
                if ended and p is not None:  # its stage ended before the point's event: after its end, then
                    p.event = -1
                    self._fire(p, line.strip())
            else:
                self.seen += 1
            if p is not None and p.landed is None and self.stage == p.stage and self.seen >= p.event:
                self._fire(p, line.strip())

    def _fire(self, p: KillPoint, line: str) -> None:
        time.sleep(p.delay)
        if self.proc.poll() is not None:
            return
        p.landed, p.line = self.stage, line[-200:]
        self.kill(self, p)

    def signal_group(self, name: str) -> None:
        if self.proc.pid <= 0:  # a forked command that died before it said its pid: never killpg(0), our own group
            return
        try:
            os.killpg(self.proc.pid, getattr(signal, name))
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None when it ran past timeout (then it is killed)."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal_group("SIGKILL")
            self.proc.wait()
            rc = None
        self.reader.join(10)
        return rc
