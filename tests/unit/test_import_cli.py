"""`rlcli import` and `python scripts/import.py` as a person runs them: files, pipes, exit codes, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "import"
RLCLI = Path(sys.executable).with_name("rlcli")
SCRIPT = [sys.executable, str(ROOT / "scripts" / "import.py")]
GOOD = {
    "messages": [{"role": "user", "content": "hi"}],
    "choices": [{"message": {"role": "assistant", "content": "yo"}}],
}
NO_REPLY = {"messages": [{"role": "user", "content": "hi"}]}

pytestmark = pytest.mark.skipif(not RLCLI.exists(), reason="rlcli is not installed next to this python")


def run(args: list[str], stdin: bytes = b"", cmd: list[str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run((cmd or [str(RLCLI), "import"]) + args, input=stdin, capture_output=True, timeout=60)


def jsonl(*records) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    err = proc.stderr.decode()
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_file_to_output_file_with_summary_on_stderr(tmp_path):
    out = tmp_path / "train.jsonl"
    proc = run([str(FIXTURES / "openai.jsonl"), "-f", "openai", "-o", str(out)])
    assert proc.returncode == 0 and proc.stdout == b""
    assert len(out.read_text().splitlines()) == 6
    assert proc.stderr.decode().strip() == (
        "import: read 11, wrote 6, dropped 5 (no_assistant_reply: 1, no_prompt: 1, error_response: 1, "
        "truncated: 1, unrecognized: 1); dropped parts: image 1, extra_choice 1"
    )
    assert out.stat().st_mode & 0o777 == 0o600  # the user's traces: theirs alone, whatever the umask
    assert [p.name for p in tmp_path.iterdir()] == ["train.jsonl"]  # no temp file left behind


def test_a_chat_completions_import_loads_only_what_it_reads(tmp_path):
    """Start-up is a visible share of an import's time: request/response pairs load no other format's reader, no
    Responses chain joiner, and at exit no tinker client. The command runs as itself; the last exit handler
    prints every module loaded."""
    pair = {"request": NO_REPLY, "response": {"choices": GOOD["choices"]}}
    (tmp_path / "pairs.jsonl").write_bytes(jsonl(pair, pair))
    probe = ("import atexit, runpy, sys; atexit.register(lambda: print(*sorted(sys.modules), file=sys.stderr)); "
             "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "-c", probe, str(RLCLI), "import", str(tmp_path / "pairs.jsonl"),
                           "-f", "openai", "-o", str(out)], capture_output=True, timeout=60)
    assert proc.returncode == 0 and len(out.read_bytes().splitlines()) == 2
    loaded = set(proc.stderr.decode().splitlines()[-1].split())
    assert {"rlcli.data.import_cmd", "orjson"} <= loaded  # the list is read right
    others = {"rlcli.data.responses", "rlcli.data.chains", "rlcli.data.gemini", "rlcli.data.otel", "rlcli.data.traces",
              "rlcli.data.redact", "rlcli.client", "urllib.request", "asyncio"}
    assert loaded & others == set()


def test_stdin_to_stdout():
    proc = run(["-"], stdin=jsonl(GOOD, NO_REPLY))
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    }
    assert "dropped 1 (no_assistant_reply: 1)" in proc.stderr.decode()


def test_strict_stops_at_the_first_drop_naming_its_line(tmp_path):
    out = tmp_path / "out.jsonl"
    proc = run(["-", "--strict", "-o", str(out)], stdin=jsonl(GOOD, GOOD, NO_REPLY, GOOD))
    assert proc.returncode == 2
    assert one_line_error(proc) == (
        "rlcli: error: line 3: record dropped (no_assistant_reply); --strict stops at the first drop"
    )
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no half-written dataset


def test_strict_also_stops_on_dropped_parts():
    image = {"type": "image_url", "image_url": {"url": "u"}}
    record = {**GOOD, "messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, image]}]}
    proc = run(["-", "--strict"], stdin=jsonl(record))
    assert proc.returncode == 2 and "line 1: 1 image part(s) left out" in one_line_error(proc)


def test_bad_json_is_an_error_naming_its_line_or_skipped_and_counted():
    data = jsonl(GOOD) + b"\n" + b'{"messages": [oops\n' + jsonl(GOOD)
    proc = run(["-"], stdin=data)
    assert proc.returncode == 2
    assert one_line_error(proc).startswith("rlcli: error: line 3: not valid JSON (")
    proc = run(["-", "--skip-bad"], stdin=data)
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 2
    assert "read 3, wrote 2, dropped 1 (bad_json: 1)" in proc.stderr.decode()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["-", "-f", "xml"], "argument --format/-f: invalid choice: 'xml'"),
        (["-", "--join-trace"], "-f otel"),
        (["-", "--min-score", "0.5"], "-f langsmith"),
        (["/no/such/file.jsonl"], "is not a file"),
        (["-", "-o", "/no/such/dir/out.jsonl"], "does not exist"),
    ],
)
def test_usage_errors_are_one_line_with_exit_code_2(args, says):
    proc = run(args, stdin=jsonl(GOOD))
    assert proc.returncode == 2 and says in one_line_error(proc)


def test_langsmith_with_feedback_file_and_min_score():
    proc = run(
        [
            str(FIXTURES / "langsmith.jsonl"),
            "-f",
            "langsmith",
            "--min-score",
            "0.5",
            "--feedback",
            str(FIXTURES / "langsmith_feedback.jsonl"),
        ]
    )
    assert proc.returncode == 0
    kept = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [c["run_id"] for c in kept] == ["run-1"] and kept[0]["score"] == pytest.approx(0.9)


def test_redact_and_drop_flags_reach_the_output():
    record = {
        "messages": [{"role": "user", "content": "I am jane@corp.com"}],
        "choices": [{"message": {"role": "assistant", "content": "Noted.", "reasoning_content": "think"}}],
    }
    proc = run(["-", "--redact", "--drop-thinking"], stdin=jsonl(record))
    conv = json.loads(proc.stdout)
    assert conv["messages"][0]["content"] == "I am <EMAIL>" and "reasoning" not in conv["messages"][1]
    assert "redacted: EMAIL 1" in proc.stderr.decode()


def test_script_entry_point_same_behaviour(tmp_path):
    out = tmp_path / "out.jsonl"
    proc = run([str(FIXTURES / "messages.jsonl"), "--format", "messages", "--output", str(out)], cmd=SCRIPT)
    assert proc.returncode == 0 and proc.stdout == b"" and len(out.read_text().splitlines()) == 6
    proc = run(["-"], stdin=jsonl(GOOD), cmd=SCRIPT)
    assert proc.returncode == 0 and json.loads(proc.stdout)["messages"][1]["content"] == "yo"
    proc = run(["-", "--strict"], stdin=jsonl(NO_REPLY), cmd=SCRIPT)
    assert proc.returncode == 2 and "line 1: record dropped (no_assistant_reply)" in one_line_error(proc)
    proc = run(["-"], stdin=b"{bad\n", cmd=SCRIPT)
    assert proc.returncode == 2 and "line 1: not valid JSON" in one_line_error(proc)
    proc = run(["-", "--skip-bad"], stdin=b"{bad\n" + jsonl(GOOD), cmd=SCRIPT)
    assert proc.returncode == 0 and "dropped 1 (bad_json: 1)" in proc.stderr.decode()


def test_gzip_input_is_read_as_it_streams(tmp_path):
    import gzip

    dump = tmp_path / "logs.jsonl.gz"
    with gzip.open(dump, "wb") as f:
        f.write(jsonl(GOOD, GOOD))
    proc = run([str(dump)])
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 2


@pytest.mark.parametrize(
    ("fixture", "fmt", "summary"),
    [
        ("responses.jsonl", "openai", "read 11, wrote 7, dropped 4 (no_input: 2, truncated: 1, "
                                      "previous_response_missing: 1)"),
        ("gemini.jsonl", "gemini", "read 9, wrote 4, dropped 5 (truncated: 1, blocked: 1, error_response: 1, "
                                   "no_assistant_reply: 1, unrecognized: 1)"),
        ("otel.jsonl", "otel", "read 12, wrote 6, dropped 6 (non_llm_span: 2, no_content: 1, truncated: 1, "
                               "unrecognized: 1, no_spans: 1)"),
    ],
)  # fmt: skip
def test_new_formats_account_for_every_record(fixture, fmt, summary):
    proc = run([str(FIXTURES / fixture), "-f", fmt])
    assert proc.returncode == 0 and summary in proc.stderr.decode()
    assert len(proc.stdout.splitlines()) == int(summary.split("wrote ")[1].split(",")[0])


def test_dedupe_and_join_trace_flags():
    data = (FIXTURES / "gemini.jsonl").read_bytes() * 2
    proc = run(["-", "-f", "gemini", "--dedupe"], stdin=data)
    assert proc.returncode == 0 and "wrote 4," in proc.stderr.decode() and "duplicate: 4" in proc.stderr.decode()
    proc = run([str(FIXTURES / "otel.jsonl"), "-f", "otel", "--join-trace"])
    assert proc.returncode == 0 and "earlier_in_trace: 2" in proc.stderr.decode()


def test_responses_chains_join_the_same_from_a_file_and_from_a_pipe(tmp_path):
    """A regular file is read back by offset, a pipe through a spool: the output must not differ."""
    fixture = FIXTURES / "responses.jsonl"
    from_file = run([str(fixture), "-f", "openai"])
    from_pipe = run(["-", "-f", "openai"], stdin=fixture.read_bytes())
    assert from_file.returncode == from_pipe.returncode == 0
    assert from_file.stdout == from_pipe.stdout and from_file.stdout.count(b"\n") == 7


@pytest.mark.parametrize("args", [["--version"], ["import", str(ROOT / "rlcli" / "data" / "demo" /
                                                                 "demo-traces.openai.jsonl")]])
def test_a_reader_that_stops_reading_gets_no_traceback(args):
    """`rlcli --version | head -1`: output into a pipe nobody reads is the end, not a traceback."""
    read, write = os.pipe()
    os.close(read)  # every write the command makes fails with EPIPE
    try:
        proc = subprocess.run([str(RLCLI), *args], stdout=write, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    # `import` treats a closed reader as having all it wanted and still reports its tallies
    assert proc.returncode == (0 if args[0] == "import" else 141)
