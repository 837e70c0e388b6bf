"""Options declared once (rlcli.options): every command takes one record; no flag is declared twice; no option's
help is written outside its declaration; the one validator's bounds, types and choices; what derives from the
records (serve restart, loop.toml, `loop init`'s flags, the loop's trainer stages)."""

from __future__ import annotations

import ast
import inspect
import typing
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from rlcli import options
from rlcli.errors import UsageError
from tests import structure

COMMANDS = dict(structure.commands())


def records() -> dict[str, type]:
    found = {}
    for words, fn in COMMANDS.items():
        params = list(inspect.signature(fn).parameters)
        if params:
            found[words] = typing.get_type_hints(fn)[params[0]]
    return found


def test_every_command_takes_one_record_of_options_or_none():
    for words, fn in COMMANDS.items():
        params = list(inspect.signature(fn).parameters)
        assert len(params) <= 1, f"rlcli {words}: {params}"
    assert all(issubclass(r, options.Record) for r in records().values())
    assert {"train sl", "train rl", "train distill", "train harbor", "serve start", "loop init"} <= set(records())


def test_no_flag_is_declared_twice():
    found = structure.declarations()
    twice = {name: len(d) for name, d in found.items() if len(d) > 1 and name not in options.HOMONYMS}
    assert twice == {}, f"flags declared more than once (declare each once, or say why in HOMONYMS): {twice}"
    for name, meanings in options.HOMONYMS.items():
        assert len(found.get(name, ())) == len(meanings), (name, found.get(name))


def test_the_trainers_share_their_common_options():
    from rlcli.harbor.train import HarborTrainOptions
    from rlcli.train.distill import DistillOptions
    from rlcli.train.dpo import DpoOptions
    from rlcli.train.options import TrainOptions
    from rlcli.train.rl import RlOptions
    from rlcli.train.sl import SlOptions

    shared = {spec.name: spec.opt for spec in options.specs(TrainOptions)}
    for record in (SlOptions, DpoOptions, RlOptions, DistillOptions, HarborTrainOptions):
        mine = {spec.name: spec.opt for spec in options.specs(record)}
        assert all(mine[name] is opt for name, opt in shared.items()), record


def _strings(path: Path) -> list[str]:
    return [n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)]


def test_no_option_help_is_written_outside_its_declaration():
    sources = [*(structure.REPO / "rlcli").rglob("*.py"), *(structure.REPO / "scripts").glob("*.py")]
    texts = [s for path in sources for s in _strings(path)]
    helps = {spec.opt.help for record in records().values() for spec in options.specs(record)}
    copied = sorted(h for h in helps if texts.count(h) > 1)
    assert copied == [], f"option help written more than once in the source: {copied}"


def test_command_docstrings_hold_no_flag_lists():
    for words, fn in COMMANDS.items():
        assert "Args:" not in (inspect.getdoc(fn) or ""), f"rlcli {words}: its flags' help lives in its record"


def test_argparse_is_built_only_from_records():
    for path in (structure.REPO / "rlcli").rglob("*.py"):
        if path.name != "cli.py" and "runtime" not in path.parts:
            assert "add_argument(" not in path.read_text(), path


# --- the one validator ----------------------------------------------------------------------------------------


RATE = options.Opt("a rate", low=0, above=True)
SHARE = options.Opt("a share", low=0, high=1, above=True, below=True)
DISCOUNT = options.Opt("a discount", low=0, high=1, below=True)


@dataclass(frozen=True, kw_only=True)
class Example(options.Record):
    count: int = options.option(1, "how many", low=1)
    off: int = options.option(0, "0: off", low=0)
    rate: float = RATE(0.5)
    share: float = SHARE(0.5)
    discount: float = DISCOUNT(0.0)
    port: int = options.option(80, "a port", low=1, high=65535, why="TCP's range")
    mode: typing.Literal["a", "b"] = options.option("a", "a mode")
    name: str | None = options.option(None, "a name")
    flag: bool = options.option(False, "a switch")

    def problems(self):
        if self.mode == "b" and self.count < 2:
            yield "--mode b needs --count 2 or more"


@pytest.mark.parametrize(("values", "message"), [
    ({"count": 0}, "--count must be at least 1, got 0"),
    ({"off": -1}, "--off must be 0 or more, got -1"),
    ({"rate": 0.0}, "--rate must be positive, got 0.0"),
    ({"share": 1.0}, "--share must be between 0 and 1, got 1.0"),
    ({"discount": 1.0}, "--discount must be in [0, 1), got 1.0"),
    ({"port": 0}, "--port must be 1 to 65535, got 0 (TCP's range)"),
    ({"mode": "c"}, "--mode c: choose from a, b"),
    ({"name": 3}, "--name 3: give text"),
    ({"count": "2"}, "--count '2': give a whole number"),
    ({"flag": "yes"}, "--flag 'yes': give true or false"),
    ({"mode": "b"}, "--mode b needs --count 2 or more"),
])
def test_the_validator_refuses_in_one_line(values, message):
    with pytest.raises(UsageError) as refused:
        Example(**values)
    assert str(refused.value) == message


def test_the_validator_accepts_and_makes_an_int_a_float():
    made = Example(rate=2, name=None, mode="b", count=2)
    assert made.rate == 2.0 and isinstance(made.rate, float)


def test_a_field_without_a_declaration_is_refused():
    @dataclass(frozen=True, kw_only=True)
    class Bare(options.Record):
        x: int = 1

    with pytest.raises(TypeError, match="Bare.x is no option"):
        Bare()


# --- what derives from the records ------------------------------------------------------------------------------


def test_serve_restart_takes_start_s_declarations():
    from rlcli.server import commands

    start = {spec.name: spec for spec in options.specs(commands.StartOptions)}
    restart = options.specs(commands.RestartOptions)
    assert [spec.name for spec in restart] == ["wait", "name"]
    assert all(spec.opt is start[spec.name].opt and spec.default == start[spec.name].default for spec in restart)


def test_loop_init_offers_every_loop_toml_setting_as_a_flag(capsys):
    from rlcli.cli import main
    from rlcli.loop.settings import LoopSettings

    with pytest.raises(SystemExit):
        main(["loop", "init", "--help"])
    shown = capsys.readouterr().out
    assert all(f"--{f.name.replace('_', '-')}" in shown for f in fields(LoopSettings))


def test_the_loop_calls_each_trainer_with_its_record(tmp_path):
    from rlcli.loop import stages
    from rlcli.loop.ledger import Champion
    from rlcli.loop.settings import LoopSettings
    from rlcli.train.distill import DistillOptions, train_distill
    from rlcli.train.rl import RlOptions, train_rl
    from rlcli.train.sl import SlOptions, train_sl

    data = tmp_path / "train.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n' * 5)
    s = LoopSettings(traces="x", lr=0.01, distill_lr=0.001, steps=3, distill_steps=2, batch_size=2)
    made = {kind: stages.stage(kind, tmp_path / kind, data, "tinker://m/weights/1", Champion(0), s, "http://u", False)
            for kind in ("sft", "rl", "distill")}
    assert [fn for fn, _ in made.values()] == [train_sl, train_rl, train_distill]
    sft, rl, distill = (o for _, o in made.values())
    assert isinstance(sft, SlOptions) and (sft.batch_size, sft.epochs, sft.lr, sft.max_steps) == (2, 2, 0.01, 3)
    assert isinstance(rl, RlOptions) and (rl.env, rl.match, rl.eval_every) == ("replay", "normalized", 0)
    assert isinstance(distill, DistillOptions)
    assert (distill.lr, distill.max_steps, distill.teacher) == (0.001, 2, "base")
    assert {o.load_checkpoint for o in (sft, rl, distill)} == {"tinker://m/weights/1"}
