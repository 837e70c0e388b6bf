"""The continual-learning loop killed at random: `rlcli loop run`, `loop promote` and `loop rollback`, and the
SkyRL server under them, each killed at kill points drawn from a seed, resumed, and checked.

Launch:  .venv/bin/python -m benchmarks.kill_loop --seed 0 --kills 50       (make kill-test)
         .venv/bin/python -m benchmarks.kill_loop --seed 7 --kills 60 --keep /tmp/kl   (replay seed 7, keep folders)

One private server on the embedded model (CPU) and one loop folder (`sft,rl,distill,dpo`, 2 steps a stage, a
16-chat batch with preference pairs per round: seconds per stage; a hook that takes HOOK_S). Each round delivers a
batch and runs the loop; an iteration the gate did not promote is promoted by hand (`loop promote`: the auto gate
never passes these candidates, so export and promotion points wait for it), and every second round rolls the
champion back (`loop rollback`). Kill points (benchmarks/kill_points.py) cycle through the stages in a seeded
order, up to PENDING waiting at a time; each lands on the command running when its stage comes, SIGKILL or SIGTERM
to the command's process group, or kill -9 to every server process. After a kill the folder is checked as a
reader finds it (benchmarks/loop_invariants.py at_kill), the server is started again if it was the one killed, the
same command is run again (itself open to the next kill point) until it completes, and each round ends with every
invariant checked. The receipt records the seed, every kill point (stage, event, delay, signal, target, where it
landed, the resume's outcome, the invariants), and the counts by stage.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.kill_points import HOOK_S, KillPoint, Watched, draw, fresh
from benchmarks.loop_invariants import after_resume, at_kill
from rlcli.loop import batches, data, settings
from rlcli.loop.ledger import Champion, opened
from rlcli.server import private, process

# server_timeout: a killed server ends the command in 20 s, not a trainer's default 60 (the server restarts at once)
SETTINGS = dict(train="sft,rl,distill,dpo", match="number", steps=2, distill_steps=1, lr=1e-2, save_every=1,
                max_tokens=4, eval_limit=4, regression_margin=1.0, batch_size=4, group_size=2, server_timeout=20.0)
CHATS = 16  # a batch: 12 to train, a few held out
COMMAND_TIMEOUT_S = 600
ARMED_TRIES = 4  # commands a kill point waits through for its stage before it is dropped (not reached)
FREED = "server LoRA slot"  # in the line a loop command says when it freed what a killed one held (sessions.py)
PENDING = 6  # a round draws points until this many wait (each command is open to one at a time)
# The commands a stage's points wait for. The auto gate never passes these 2-step candidates (their slices cannot show
# a gain), so every promotion is `loop promote`'s (the same export and alias move as a gate's): an export or promotion
# point offered to `loop run` would hold each of its attempts for a stage that never comes.
RUN_COMMANDS = {"run": lambda stage: stage not in ("export", "promotion", "rollback"),
                "promote": lambda stage: stage in ("export", "promotion"),
                "rollback": lambda stage: stage == "rollback"}


def say(line: str) -> None:
    print(f"kill_loop: {line}", file=sys.stderr, flush=True)


class Server:
    """A private SkyRL server that may be killed (-9, every process) and started again on its home and port."""

    def __init__(self, home: Path, model: str):
        self.home, self.model, self.port = home, model, private.free_port()
        self.env = dict(private.private_env(home), TINKER_API_KEY="tml-kill-loop")
        self.url = f"http://{private.HOST}:{self.port}"

    def start(self) -> None:
        proc = subprocess.run(private.start_command(self.model, self.port, "--slots", "4"), env=self.env,
                              capture_output=True, text=True, timeout=900, cwd=private.PACKAGE_PARENT)
        if proc.returncode:
            raise RuntimeError(f"rlcli serve start exited {proc.returncode}: {proc.stderr[-2000:]}")

    def stop(self) -> None:
        subprocess.run([*private.RLCLI, "serve", "stop"], env=self.env, capture_output=True, timeout=120)

    def kill9(self) -> list[int]:
        state = process.read_state(self.home / "servers" / "default")
        pids = process.live_members(state) if state else []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids


class Harness:
    """One loop folder driven through rounds, with the kill points of one seed landing on its commands, each
    started by `spawn` (kill_points.fresh: a process of its own)."""

    def __init__(self, root: Path, server: Server, seed: int, server_share: float = 0.15,
                 overrides: dict[str, Any] | None = None, spawn: Callable[[list[str], dict[str, str]], Any] = fresh):
        self.root, self.server, self.rng, self.spawn = root, server, random.Random(seed), spawn
        self.seed, self.server_share = seed, server_share
        self.folder, self.inbox, self.hook_log = root / "loop", root / "inbox", root / "hook.log"
        self.delivered: list[Path] = []
        self.pending: list[KillPoint] = []
        self.points: list[KillPoint] = []
        self.rounds: list[dict[str, Any]] = []
        self.cycle: list[str] = []
        self.freed: list[str] = []  # each command's line saying it freed the slots a killed one held
        self.settings = {**SETTINGS, **(overrides or {})}
        self.stage_names = ["ingest", "split", "power", *(f"train:{k}" for k in self.settings["train"].split(",")),
                            "scoring", "gate", "export", "promotion", "rollback"]

    def init(self) -> None:
        self.inbox.mkdir(parents=True)
        regression = batches.write_regression(self.root / "regression.jsonl", n=4)
        self._rlcli("loop", "init", str(self.folder), "--traces", str(self.inbox / "batch-*.openai.jsonl"),
                    "-f", "openai", "--regression", str(regression), "--base-url", self.server.url,
                    "--hook", f"sleep {HOOK_S}; echo $RLCLI_LOOP_ITERATION >> {self.hook_log}")
        s = settings.read(self.folder)
        settings.write(self.folder, type(s)(**{**s.__dict__, **self.settings}))

    def _rlcli(self, *args: str) -> None:
        proc = self.spawn(list(args), self.server.env)
        try:
            _, err = proc.communicate(timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        if proc.returncode:
            raise RuntimeError(f"rlcli {' '.join(args[:2])} exited {proc.returncode}: {err[-2000:]}")

    def draw_points(self, count: int) -> None:
        for _ in range(max(count, 0)):
            if not self.cycle:
                self.cycle = self.stage_names[:]
                self.rng.shuffle(self.cycle)
            point = draw(self.rng, self.cycle, self.server_share)
            self.pending.append(point)
            self.points.append(point)

    def landed(self) -> int:
        return sum(p.landed is not None for p in self.points)

    # --- one round ------------------------------------------------------------------------------------------
    def round(self, r: int, kills: int | None = None) -> dict[str, Any]:
        """Deliver batch r, draw `kills` more kill points (default: 4-6, fewer where some still wait), run the
        round's commands to the end."""
        started = time.monotonic()
        self.deliver(r)
        self.draw_points(min(self.rng.randint(4, 6), PENDING - len(self.pending)) if kills is None else kills)
        self.command("run", ["loop", "run", str(self.folder), "--once"])
        with opened(self.folder) as ledger:
            n = ledger.last_iteration()
            it = ledger.iteration(n)
        if it["decision"] in ("rejected", "pending"):
            self.command("promote", ["loop", "promote", str(self.folder), str(n)])
        if r % 2 == 0 and (back := self.rollback_target()) is not None:
            self.command("rollback", ["loop", "rollback", str(self.folder), str(back)])
        problems = after_resume(self.folder, self.delivered, self.hook_log)
        with opened(self.folder) as ledger:
            champ = ledger.champion().iteration
        row = {"round": r, "iteration": n, "decision": it["decision"], "champion": champ,
               "invariants": problems or "all hold", "seconds": round(time.monotonic() - started, 1)}
        say(f"round {r}: iteration {n} {it['decision']}, champion {champ}, {self.landed()} kills so far; "
            f"invariants: {problems or 'all hold'}")
        self.rounds.append(row)
        return row

    def deliver(self, r: int) -> None:
        """Round r's batch of traces, with its preference pairs beside it, into the inbox."""
        path = self.inbox / f"batch-{r}.openai.jsonl"
        batches.write_batch(path, 1 + (r - 1) % 3, CHATS, seed=self.seed * 1000 + r)
        data.write_jsonl(data.pairs_beside(path), _pairs(r))
        self.delivered.append(path)

    def rollback_target(self) -> int | None:
        """The champion before the current one (as `loop rollback` picks it), given explicitly so a rerun after a
        kill asks for the same one."""
        with opened(self.folder) as ledger:
            current = ledger.champion()
            earlier = [Champion(0), *(Champion(a["iteration"] or 0, a["sampler_path"]) for a in ledger.aliases())]
        back = next((c for c in reversed(earlier) if c.iteration != current.iteration), None)
        return None if back is None else back.iteration

    def command(self, name: str, args: list[str]) -> None:
        """Run the command until it completes, each attempt open to the next pending kill point that can land
        in it; after each kill the folder is checked as a reader would find it."""
        killed: list[KillPoint] = []
        while True:
            point = next((p for p in self.pending if RUN_COMMANDS[name](p.stage)), None)
            started = time.monotonic()
            w = self.current = Watched(args, self.server.env, name, point, self._kill, self.spawn)
            rc = w.wait(COMMAND_TIMEOUT_S)
            took = round(time.monotonic() - started, 1)
            if point is None or point.landed is None:
                if point is not None:  # its stage never came in this command: a few more tries, then dropped
                    point.outcome["commands_armed"] = point.outcome.get("commands_armed", 0) + 1
                    if point.outcome["commands_armed"] >= ARMED_TRIES:
                        self.pending.remove(point)
                if rc != 0:
                    raise RuntimeError(f"rlcli {' '.join(args[:2])} exited {rc} with no kill:\n"
                                       + "\n".join(w.lines[-30:]))
                said = next((x for x in w.lines if "resuming" in x or "already" in x), "")
                for p in killed:  # each kill of this command resumed: its last attempt completed
                    p.outcome |= {"resumed": True, "resume_seconds": took, "resume_said": said[-200:]}
                self.freed += [x[-300:] for x in w.lines if FREED in x]
                return
            self.pending.remove(point)
            point.command = name
            point.outcome = {"rc": rc, "exit_seconds": took, "hung": rc is None,
                             "last_line": w.lines[-1][-300:] if w.lines else "",
                             "at_kill": at_kill(self.folder) or "all hold"}
            say(f"{point.label()} landed in {point.landed} of `loop {name}` (rc {rc}); at kill: "
                f"{point.outcome['at_kill']}")
            if point.target == "server":
                self.server.start()
            killed.append(point)
            self.freed += [x[-300:] for x in w.lines if FREED in x]

    current: Watched | None = None

    def stop(self) -> None:
        """The command running now, if any (the harness itself was stopped): it runs in a session of its own."""
        if self.current is not None and self.current.proc.poll() is None:
            self.current.signal_group("SIGKILL")

    def _kill(self, w: Watched, p: KillPoint) -> None:
        if p.target == "server":
            p.outcome["server_pids"] = len(self.server.kill9())
        else:
            w.signal_group(p.signal)


def _pairs(r: int) -> list[dict[str, Any]]:
    return [{"messages": [{"role": "user", "content": f"What is {i} + {r}?"}],
             "chosen": {"role": "assistant", "content": str(i + r)},
             "rejected": {"role": "assistant", "content": "I do not know."}} for i in range(4)]


def summary(h: Harness) -> dict[str, Any]:
    """Kill points landed and survived (every invariant held after the resume of the round), by stage."""
    failed_rounds = {row["round"] for row in h.rounds if row["invariants"] != "all hold"}
    by_stage: dict[str, dict[str, int]] = {}
    for p in h.points:
        if p.landed is None:
            continue
        row = by_stage.setdefault(p.stage, {"landed": 0, "survived": 0, "server": 0, "sigterm": 0})
        row["landed"] += 1
        row["server"] += p.target == "server"
        row["sigterm"] += p.signal == "SIGTERM" and p.target == "loop"
        ok = p.outcome.get("at_kill") == "all hold" and p.outcome.get("resumed") and not p.outcome.get("hung")
        row["survived"] += bool(ok) and p.outcome.get("round") not in failed_rounds
    landed = sum(r["landed"] for r in by_stage.values())
    dropped = sum(p.landed is None and p.outcome.get("commands_armed", 0) >= ARMED_TRIES for p in h.points)
    return {"landed": landed, "survived": sum(r["survived"] for r in by_stage.values()), "by_stage": by_stage,
            "server_kills": sum(r["server"] for r in by_stage.values()),
            "not_reached": dropped, "still_pending_at_the_end": sum(p.landed is None for p in h.points) - dropped,
            "rounds": len(h.rounds),
            "rounds_with_broken_invariants": sorted(failed_rounds)}


def main(seed: int = 0, kills: int = 50, server_share: float = 0.15, max_rounds: int = 200, out: str | None = None,
         keep: str | None = None) -> dict[str, Any]:
    """Run rounds until `kills` kill points have landed; write the receipt (benchmarks/receipts, or `out`)."""
    from benchmarks.common import stop_servers_on_sigterm, versions, write_receipt
    from rlcli.model import ensure_embedded_model

    stop_servers_on_sigterm()
    root = Path(keep or tempfile.mkdtemp(prefix="rlcli-kill-loop-")).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    started, load = time.monotonic(), os.getloadavg()
    server = Server(root / "home", str(ensure_embedded_model()))
    (root / "home").mkdir(mode=0o700, exist_ok=True)
    server.start()
    h = Harness(root, server, seed, server_share)
    stopped = None  # why the run ended before `kills` landed: a command that failed on its own, or a stop
    try:
        h.init()
        r = 0
        while h.landed() < kills and r < max_rounds:
            r += 1
            before = {id(p) for p in h.points if p.landed is not None}
            try:
                h.round(r)
            finally:
                for p in h.points:
                    if p.landed is not None and id(p) not in before:
                        p.outcome["round"] = r
    except (Exception, SystemExit, KeyboardInterrupt) as e:  # the receipt still says how far it got, and why
        stopped = f"{type(e).__name__}: {e}"[-3000:]
        say(f"stopped: {stopped}")
    finally:
        h.stop()
        server.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    body = {"seed": seed, "kills_asked": kills, "server_share": server_share, "stopped": stopped,
            "versions": versions("tinker", "tinker-cookbook"), "settings": h.settings, "chats_per_batch": CHATS,
            "minutes": round((time.monotonic() - started) / 60, 2),
            "load_average_1_5_15": {"before": load, "after": os.getloadavg()},
            "summary": summary(h), "slots_freed_by_resumes": h.freed, "rounds": h.rounds,
            "kill_points": [p.record() for p in h.points],
            "replay": f"python -m benchmarks.kill_loop --seed {seed} --kills {kills}"}
    receipt = write_receipt("kill-loop", body, Path(out) if out else None, names={str(root): "$ROOT"})
    s = body["summary"]
    say(f"{s['survived']} of {s['landed']} kill points survived ({s['server_kills']} of the server; "
        f"{s['not_reached']} not reached, {s['still_pending_at_the_end']} drawn but still waiting at the end) in "
        f"{s['rounds']} rounds, {body['minutes']} min; by stage: "
        + ", ".join(f"{k} {v['survived']}/{v['landed']}" for k, v in sorted(s["by_stage"].items())))
    say(f"receipt: {receipt}")
    return body


if __name__ == "__main__":
    import fire

    fire.Fire(main)
