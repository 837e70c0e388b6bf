"""The README is the first screens: short, the two set-up commands first, one working example per command, and a
link to each topic's manual in docs/ (the manuals hold the rest; flags come from --help)."""

from __future__ import annotations

import re
import shlex

from rlcli import cli
from tests.conftest import REPO

README = (REPO / "README.md").read_text()
MAX_LINES = 300
TOPICS = ("serve", "team-server", "scaling", "loop", "harbor", "faults", "import", "train", "distill", "weights",
          "endpoint")


def test_the_readme_fits_on_a_few_screens():
    assert len(README.splitlines()) <= MAX_LINES, "move the detail to its topic's page in docs/"


def test_the_two_set_up_commands_come_first():
    head = "\n".join(README.splitlines()[:60])
    assert "make demo" in head and "make test" in head


def commands_block() -> list[list[str]]:
    block = README.split("## The commands", 1)[1].split("```")[1]
    lines = [line.split("  #")[0].strip() for line in block.strip().splitlines()]
    return [shlex.split(part)[1:] for line in lines for part in line.split(";")]


def test_every_command_has_an_example_that_parses():
    examples = commands_block()
    top = {words[0] for words in examples}
    assert set(cli.COMMANDS) <= top, f"no example of {sorted(set(cli.COMMANDS) - top)}"
    assert top & set(cli.PASSTHROUGH), "no example of tinker's own CLI (checkpoint|run|session)"
    assert {words[1] for words in examples if words[0] == "train"} >= {"sl", "rl", "distill", "harbor"}
    for words in examples:
        if words[0] in cli.PASSTHROUGH:
            continue
        parser, path = cli._build_parser(words)
        parser.parse_args(words[len(path):])  # exits (a failed test) on a flag the command does not take


def test_every_topic_has_its_manual_and_the_readme_links_each_one():
    links = set(re.findall(r"\]\(((?:docs|benchmarks)/[^)]+\.md)\)", README))
    assert {f"docs/{topic}.md" for topic in TOPICS} <= links
    assert [link for link in sorted(links) if not (REPO / link).is_file()] == []


def test_the_manuals_link_only_to_pages_that_exist():
    named = {m for page in (REPO / "docs").glob("*.md") for m in re.findall(r"\bdocs/[\w-]+\.md\b", page.read_text())}
    assert [name for name in sorted(named) if not (REPO / name).is_file()] == []
