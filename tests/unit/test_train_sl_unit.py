"""Fast tests of `rlcli train sl`'s pieces: data checks, renderer choice, run folders, clean-up. No server."""

from __future__ import annotations

import http.server
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlcli import client, slots
from rlcli.errors import RlcliError, UsageError
from rlcli.train import folder as runs
from rlcli.train import renderers, run, sl
from rlcli.train.options import kept

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "sl_small.jsonl"
OPTIONS = sl.SlOptions(dataset="-", model="m", renderer="role_colon", lr=1e-4)
SETTINGS = kept(OPTIONS, train_on_what="last_assistant_message")
CHAT = {"messages": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCLI_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    return tmp_path / "home"


def lines(*records: object) -> io.StringIO:
    return io.StringIO("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


# --- the dataset check ---------------------------------------------------------------------------


@pytest.mark.parametrize(("bad", "says"), [
    ("{not json", "not valid JSON"),
    ({"text": "hi"}, '{"messages": [...]}'),
    ({"messages": []}, "empty"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "role 'wizard'"),
    ({"messages": [{"role": "user"}]}, "content"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant message"),
])
def test_first_bad_line_is_named_with_its_number(bad, says):
    with pytest.raises(UsageError) as e:
        sl.read_dataset("-", stdin=lines(CHAT, "", bad, CHAT))
    assert "stdin line 3:" in str(e.value) and says in str(e.value)
    assert "\n" not in str(e.value)


def test_a_bad_line_that_is_no_log_says_to_fix_it():
    with pytest.raises(UsageError) as e:
        sl.read_dataset("-", stdin=lines({"messages": [{"role": "user", "content": "hi"}]}, {"text": "hi"}))
    assert str(e.value).endswith("no assistant message to train on; fix it, or rebuild with `rlcli import`")


IMPORT_FIXTURES = REPO / "tests" / "fixtures" / "import"
# Each fixture of `rlcli import`'s tests, and the -f that reads it (Responses records are openai's).
LOG_FILES = {"openai.jsonl": "openai", "responses.jsonl": "openai", "anthropic.jsonl": "anthropic",
             "gemini.jsonl": "gemini", "langsmith.jsonl": "langsmith", "langsmith_feedback.jsonl": "langsmith",
             "otel.jsonl": "otel", "messages.jsonl": "messages"}


@pytest.mark.parametrize(("name", "fmt"), sorted(LOG_FILES.items()))
def test_raw_logs_given_to_train_sl_name_the_import_that_converts_them(name, fmt):
    from rlcli.data.importers import log_format

    records = [json.loads(line) for line in (IMPORT_FIXTURES / name).read_text().splitlines() if line.strip()]
    # (gemini.jsonl holds one OpenAI record on purpose, to check -f gemini refuses it: it is openai's here)
    named = [log_format(r) for r in records if not (isinstance(r, dict) and "an OpenAI record" in r.get("//", ""))]
    assert set(named) - {None} == {fmt}, named  # no record of the file is taken for another format's
    assert named.count(fmt) >= 2
    with pytest.raises(UsageError) as e:
        sl.read_dataset(str(IMPORT_FIXTURES / name))
    assert f"`rlcli import {IMPORT_FIXTURES / name} -f {fmt} | rlcli train sl --dataset - ...`" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError) as e:  # from stdin, the command reads stdin too
        sl.read_dataset("-", stdin=io.StringIO((IMPORT_FIXTURES / name).read_text()))
    assert f"`rlcli import - -f {fmt} | rlcli train sl --dataset - ...`" in str(e.value)


def test_the_format_named_follows_the_records_marks():
    from rlcli.data.importers import log_format

    ask = [{"role": "user", "content": "2 + 2?"}]
    completion = {"choices": [{"message": {"role": "assistant", "content": "4"}}]}
    assert log_format({"model": "m", "messages": ask, **completion}) == "openai"  # the plain Chat Completions log
    assert log_format({"request": {"model": "m", "messages": ask}, "response": completion}) == "openai"
    assert log_format({"request": {"messages": ask, "system": "s"}, "response": {
        "type": "message", "content": [{"type": "text", "text": "4"}], "stop_reason": "end_turn"}}) == "anthropic"
    assert log_format({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}) == "messages"
    assert log_format({"run_type": "chain", "inputs": {"input": "q"}, "outputs": {"output": "a"}}) == "langsmith"
    assert log_format({"messages": ask}) is None  # nothing to train on, in any format: fix it
    assert log_format({"text": "hi"}) is None and log_format("hi") is None


def test_empty_input_is_an_error():
    for text in ("", "\n  \n"):
        with pytest.raises(UsageError, match="empty"):
            sl.read_dataset("-", stdin=io.StringIO(text))


def test_records_keep_only_messages_and_their_line_numbers():
    data = sl.read_dataset("-", stdin=lines({**CHAT, "run_id": "x", "score": 1}, "", CHAT))
    assert data.records == [CHAT, CHAT] and data.lines == [1, 3]
    assert data.payload.decode().splitlines() == [json.dumps(CHAT)] * 2
    assert data.sha256 == sl.read_dataset("-", stdin=lines(CHAT, CHAT)).sha256  # blank lines do not count


def test_missing_file_says_what_to_pass(tmp_path):
    with pytest.raises(UsageError, match="no dataset file"):
        sl.read_dataset(str(tmp_path / "nope.jsonl"))


def test_fixture_is_valid():
    data = sl.read_dataset(str(FIXTURE))
    assert 16 <= len(data.records) <= 32


# --- plan and flags ------------------------------------------------------------------------------


def test_plan_counts_steps_as_the_cookbook_does():
    plan = sl.make_plan(24, 8, 3, None, 0)
    assert (plan.batches_per_epoch, plan.steps) == (3, 9)
    assert sl.make_plan(24, 5, 3, 7, 0).steps == 7  # 4 batches per epoch, capped by --max-steps
    held = sl.make_plan(24, 4, 1, None, 4)
    assert (held.train_examples, held.test_examples, held.steps) == (20, 4, 5)
    assert sl.make_plan(3, 1, 1, None, 5).test_examples == 0  # the cookbook keeps all when too few


def test_a_batch_larger_than_the_data_is_an_error():
    with pytest.raises(UsageError, match="lower --batch-size"):
        sl.make_plan(5, 8, 1, None, 0)


@pytest.mark.parametrize(("kwargs", "flag"), [
    ({"batch_size": 0}, "--batch-size"), ({"lr": 0.0}, "--lr"), ({"max_steps": 0}, "--max-steps"),
    ({"save_every": -1}, "--save-every"), ({"dataset": None}, "pass --dataset FILE"),
])
def test_bad_numbers_name_their_flag(kwargs, flag):
    args = dict(dataset="chats.jsonl", batch_size=8, lr=1e-4, epochs=1, max_steps=None, lora_rank=32,
                max_length=2048, save_every=20, eval_every=10, test_size=0) | kwargs
    with pytest.raises(UsageError, match=flag):
        sl.SlOptions(**args)


# --- the model and the renderer ------------------------------------------------------------------


def test_model_must_be_the_servers(monkeypatch):
    monkeypatch.setattr("rlcli.client.server_base_model", lambda url: "/models/tiny")
    assert run.resolve_model(None, "http://x", required=True) == "/models/tiny"
    with pytest.raises(UsageError, match="not the server's model '/models/tiny'"):
        run.resolve_model("Qwen/Qwen3-8B", "http://x", required=True)


def test_unreachable_server_is_one_line_unless_a_dry_run_names_the_model():
    url = "http://127.0.0.1:9"  # the discard port: nothing listens
    with pytest.raises(RlcliError, match="rlcli serve start"):
        run.resolve_model(None, url, required=True)
    assert run.resolve_model("m", url, required=False) == "m"


def test_renderer_from_a_local_folders_tokenizer(tmp_path):
    chatml, plain = tmp_path / "chatml", tmp_path / "plain"
    chatml.mkdir(), plain.mkdir()
    (chatml / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {"1": "<|im_start|>"}}))
    (plain / "tokenizer.json").write_text(json.dumps({"added_tokens": [{"content": "<s>"}]}))
    assert renderers.choose_renderer(str(chatml)) == "qwen3_disable_thinking"
    assert renderers.choose_renderer(str(plain)) == "role_colon"
    assert renderers.choose_renderer(str(plain), "llama3") == "llama3"


def test_renderer_from_the_cookbooks_model_list():
    assert renderers.choose_renderer("Qwen/Qwen3-8B") == "qwen3"


def test_unknown_model_asks_for_a_renderer_and_lists_them():
    with pytest.raises(UsageError) as e:
        renderers.choose_renderer("acme/unheard-of-7b")
    assert "--renderer" in str(e.value) and "role_colon" in str(e.value) and "\n" not in str(e.value)


def test_train_on_what_stays_the_cookbook_default_for_multi_turn_chats():
    two = {"messages": [*CHAT["messages"], {"role": "user", "content": "3?"}, {"role": "assistant", "content": "3"}]}
    assert renderers.train_on_what([CHAT, CHAT]) == "last_assistant_message"
    assert renderers.train_on_what([CHAT, two]) == "all_assistant_messages"


# --- run folders ---------------------------------------------------------------------------------


def test_an_existing_run_folder_needs_resume(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    assert runs.run_folder(str(folder), resume=False) == folder  # empty: fine
    (folder / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(UsageError, match="pass --resume .* or a new --log-path"):
        runs.run_folder(str(folder), resume=False)
    assert runs.run_folder(str(folder), resume=True) == folder
    with pytest.raises(UsageError, match="no run folder"):
        runs.run_folder(str(tmp_path / "missing"), resume=True)


def test_default_folders_are_new_and_resume_takes_the_newest(home):
    with pytest.raises(UsageError, match="no sl run"):
        runs.run_folder(None, resume=True)
    first = runs.run_folder(None, resume=False)
    first.mkdir(parents=True)
    second = runs.run_folder(None, resume=False)
    assert first.parent == home / "runs" and first.name.startswith("sl-") and second != first
    assert runs.run_folder(None, resume=True) == first


def test_one_run_per_folder_at_a_time(tmp_path):
    with runs.claim(tmp_path / "run"):
        assert oct((tmp_path / "run").stat().st_mode & 0o777) == "0o700"
        with pytest.raises(UsageError, match="another rlcli run"), runs.claim(tmp_path / "run"):
            pass


def test_resume_refuses_other_data_and_frees_leftover_slots(tmp_path, monkeypatch):
    freed: list[list[str]] = []
    monkeypatch.setattr(client, "unload_models", lambda url, ids: freed.append(ids) or [])
    settings = SETTINGS
    (tmp_path / runs.RUN_INFO).write_text(json.dumps({"dataset_sha256": "abc", "model": "m", "batch_size": 8}))

    def check(digest: str) -> None:
        run.check_resume(tmp_path, "http://x", digest=("dataset_sha256", digest), same_input="the same dataset",
                         settings=settings, keys=sl.RESUME_KEYS)

    with pytest.raises(UsageError, match="other data"):
        check("def")
    (tmp_path / runs.RUN_INFO).write_text(json.dumps({"dataset_sha256": "abc", "batch_size": 4}))
    with pytest.raises(UsageError, match="was run with batch_size 4"):
        check("abc")
    (tmp_path / runs.RUN_INFO).write_text(json.dumps({"dataset_sha256": "abc", "model": "m", "batch_size": 8}))
    runs.note_models(tmp_path, ["model_a", "model_b"])
    check("abc")
    assert freed == [["model_a", "model_b"]] and (tmp_path / runs.MODELS_FILE).read_text() == ""


# --- no copy of the data survives ----------------------------------------------------------------


def test_private_copy_is_unlinked_at_once(home):
    with runs.private_copy(b"secret\n") as path:
        assert Path(path).read_bytes() == b"secret\n"
        assert list((home / "tmp").iterdir()) == []
        assert oct((home / "tmp").stat().st_mode & 0o777) == "0o700"


def test_private_copy_without_proc_is_deleted_on_failure(home, monkeypatch):
    real_exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda p: False if str(p).startswith("/proc/") else real_exists(p))
    with pytest.raises(RuntimeError), runs.private_copy(b"secret\n") as path:
        assert Path(path).parent == home / "tmp" and Path(path).name.startswith(runs.TEMP_PREFIX)
        raise RuntimeError("the run failed")
    assert list((home / "tmp").iterdir()) == []


@pytest.mark.parametrize("how", ["error", "sigterm"])
def test_a_failed_or_killed_run_frees_its_slot_and_leaves_no_data(home, tmp_path, monkeypatch, how):
    """The cookbook's main is replaced by one that takes a slot, then fails or gets SIGTERM."""
    import tinker
    from tinker_cookbook.supervised import train

    freed: list[list[str]] = []
    seen: dict[str, bytes] = {}
    monkeypatch.setattr(client, "unload_models", lambda url, ids: freed.append(ids) or [])
    monkeypatch.setattr(slots, "ensure_clean_next_slot", lambda url, model: None)  # no server here

    async def fake_main(config):
        seen["data"] = Path(config.dataset_builder.file_path).read_bytes()
        tinker.TrainingClient(holder=None, model_seq_id=0, model_id="model_x", info=None)  # type: ignore[arg-type]
        if how == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        raise RuntimeError("server went away")

    monkeypatch.setattr(train, "main", fake_main)
    data = sl.read_dataset(str(FIXTURE))
    folder = tmp_path / "run"
    folder.mkdir()
    job = run.Job(settings=SETTINGS, summary="", digest=("dataset_sha256", data.sha256), same_input="",
                  resume_keys=(), recipe=lambda folder, url: sl.recipe(folder, url, data, OPTIONS,
                                                                       "last_assistant_message"),
                  progress=sl.SlProgress(3), report=str)
    with pytest.raises(KeyboardInterrupt if how == "sigterm" else RuntimeError):
        run.run_recipe(folder, "http://x", job, server_timeout=0)  # no server here to watch
    assert seen["data"] == data.payload
    assert freed == [["model_x"]] and (folder / runs.MODELS_FILE).read_text() == ""
    assert list((home / "tmp").iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or how == "error"


# --- progress and the server's unload ------------------------------------------------------------


def test_progress_is_one_dense_line_per_training_step():
    out = io.StringIO()
    progress = sl.SlProgress(total_steps=10, stream=out)
    progress.log_metrics({"test/nll": 1.0}, step=0)  # an eval-only record: no line
    progress.log_metrics({"train_mean_nll": 2.5, "num_tokens": 1000, "learning_rate": 1e-4, "epoch": 1,
                          "test/nll": 2.75}, step=4)
    (line,) = out.getvalue().splitlines()
    assert line.startswith("step 5/10  epoch 1  loss 2.5000  lr 1.00e-04") and "tok/s" in line
    assert line.endswith("test_nll 2.7500")


class _FakeServer(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (the stdlib's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path.endswith("/unload_model"):
            code = {"gone": 404, "broken": 500}.get(body["model_id"], 200)
            reply = {"request_id": "7", "model_id": body["model_id"]}
        else:
            code, reply = 200, {"status": "unloaded"}
        self.send_response(code)
        self.end_headers()
        self.wfile.write(json.dumps(reply).encode())

    def log_message(self, *args):
        pass


def test_unload_models_counts_unknown_models_as_freed():
    server = http.server.HTTPServer(("127.0.0.1", 0), _FakeServer)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()  # shutdown() waits a poll
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        assert client.unload_models(url, ["model_a", "gone", "broken"]) == ["broken"]
    finally:
        server.shutdown()


def test_help_imports_nothing_heavy():
    code = ("import sys, rlcli.cli, rlcli.train.sl, rlcli.train.run, rlcli.train.folder, rlcli.train.renderers; "
            "print([m for m in ('tinker', 'tinker_cookbook', 'torch', 'transformers', 'datasets') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


def train_sl(**options):
    return sl.train_sl(sl.SlOptions(**options))


def test_dry_run_prints_the_plan_without_a_server(embedded_model, home, monkeypatch, capsys):
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "0")  # restored afterwards: the dry run sets them for a local model
    assert train_sl(dataset=str(FIXTURE), model=embedded_model, base_url="http://127.0.0.1:9",
                    batch_size=4, epochs=2, dry_run=True) is None
    out = capsys.readouterr().out
    assert "renderer: qwen3_disable_thinking" in out and "-> 12 steps" in out and "(all rendered)" in out
    assert not (home / "runs").exists()
    with pytest.raises(UsageError, match="renderer 'nope' is unknown"):
        train_sl(dataset=str(FIXTURE), model=embedded_model, base_url="http://127.0.0.1:9", renderer="nope",
                 dry_run=True)


def test_default_lr_is_measured_for_the_embedded_model_and_the_cookbooks_elsewhere(embedded_model):
    from tinker_cookbook.hyperparam_utils import get_lr

    assert run.default_lr(embedded_model) == (run.EMBEDDED_LR, "measured for the embedded model")
    assert run.default_lr("Qwen/Qwen3-4B-Instruct-2507")[0] == get_lr("Qwen/Qwen3-4B-Instruct-2507", is_lora=True)
    assert run.default_lr("openai/gpt-oss-20b")[0] == run.UNCALIBRATED_LR  # a family get_lr does not calibrate


def test_load_checkpoint_is_in_the_plan_and_a_folder_without_state_is_refused(tmp_path, capsys):
    model = str(REPO / "rlcli" / "assets" / "rlcli-tiny-qwen3-v1")
    assert train_sl(dataset=str(FIXTURE), model=model, base_url="http://127.0.0.1:9", dry_run=True,
                    load_checkpoint="tinker://r/weights/w") is None
    assert "start: tinker://r/weights/w" in capsys.readouterr().out
    with pytest.raises(UsageError, match="--load-checkpoint"):
        train_sl(dataset=str(FIXTURE), model=model, base_url="http://127.0.0.1:9", dry_run=True,
                 load_checkpoint=str(tmp_path))
