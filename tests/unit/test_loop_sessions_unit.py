"""The loop's tags for its server sessions (rlcli/loop/sessions.py): recorded before a command opens any session, and
the models of the tagged sessions freed by the next loop command. No server: the HTTP calls are replaced by a fake
that answers as SkyRL with rlcli's route, as a stock SkyRL (no route), or not at all (a killed server). The real
server's side: tests/faults/test_loop_killed.py."""

from __future__ import annotations

import io
import os
import urllib.error

import pytest

from rlcli import client
from rlcli.loop import commands, sessions
from rlcli.server.runtime.shared import TAGGED_MODELS_ROUTE

URL = "http://127.0.0.1:9"


def _http_error(code: int, body: bytes) -> urllib.error.HTTPError:
    return urllib.error.HTTPError(URL, code, "x", {}, io.BytesIO(body))  # type: ignore[arg-type]


class FakeServer:
    """Tags and the live models of their sessions; `route`: False answers as a stock SkyRL (404 Not Found)."""

    def __init__(self, models: dict[str, list[str]], route: bool = True, down: bool = False):
        self.models, self.route, self.down = models, route, down
        self.unloaded: list[str] = []

    def request_json(self, url: str, payload=None, timeout: float = 30.0):
        if self.down:
            raise ConnectionRefusedError("refused")
        assert url.endswith(TAGGED_MODELS_ROUTE)
        if not self.route:
            raise _http_error(404, b'{"detail":"Not Found"}')
        return {"tag": payload["tag"], "models": self.models.get(payload["tag"], [])}

    def unload_models(self, url: str, model_ids: list[str], wait_s: float = 30.0) -> list[str]:
        self.unloaded += model_ids
        return [m for m in model_ids if m.startswith("stuck")]


@pytest.fixture
def server(monkeypatch):
    def serve(**kwargs) -> FakeServer:
        fake = FakeServer(**kwargs)
        monkeypatch.setattr(client, "request_json", fake.request_json)
        monkeypatch.setattr(client, "unload_models", fake.unload_models)
        return fake
    return serve


def test_the_tag_is_on_disk_before_any_session_opens_and_tinker_tags_each_session_with_it(tmp_path, monkeypatch):
    """tinker reads TINKER_TAGS as it opens a session: every session inside the block carries the recorded tag."""
    monkeypatch.setenv(sessions.TAGS_ENV, "mine")
    with sessions.tagged(tmp_path, URL + "/") as tag:
        assert sessions.read(tmp_path) == [(URL, tag)] and tag.startswith(sessions.PREFIX)
        assert set(os.environ[sessions.TAGS_ENV].split(",")) == {"mine", tag}
    assert os.environ[sessions.TAGS_ENV] == "mine"
    monkeypatch.delenv(sessions.TAGS_ENV)
    with sessions.tagged(tmp_path, URL) as second:
        assert os.environ[sessions.TAGS_ENV] == second != tag
    assert sessions.TAGS_ENV not in os.environ
    assert sessions.read(tmp_path) == [(URL, tag), (URL, second)]


def test_tinker_sends_the_tags_with_a_new_session():
    """What the design rests on: tinker 0.38 builds its create_session request's tags from TINKER_TAGS."""
    import inspect

    from tinker.lib import internal_client_holder

    source = inspect.getsource(internal_client_holder.InternalClientHolder._create_session)
    assert 'os.environ.get("TINKER_TAGS")' in source and "tags=list(tags)" in source


def test_free_unloads_what_the_server_lists_and_forgets_the_tags(tmp_path, server):
    fake = server(models={"t1": ["session_a:train:1"], "t2": []})
    (tmp_path / sessions.FILE).write_text(f"{URL} t1\n{URL} t2\n{URL} t1\n")
    assert sessions.read(tmp_path) == [(URL, "t1"), (URL, "t2")]
    assert sessions.free(tmp_path) == ["session_a:train:1"]
    assert fake.unloaded == ["session_a:train:1"]
    assert not (tmp_path / sessions.FILE).exists()
    assert sessions.free(tmp_path) == []  # nothing recorded: nothing asked


def test_a_server_that_is_down_or_will_not_unload_keeps_the_tag_for_the_next_command(tmp_path, server):
    (tmp_path / sessions.FILE).write_text(f"{URL} t1\n")
    server(models={"t1": ["model_1"]}, down=True)
    assert sessions.free(tmp_path) == []
    assert sessions.read(tmp_path) == [(URL, "t1")]
    fake = server(models={"t1": ["stuck_1", "model_2"]})
    assert sessions.free(tmp_path) == ["model_2"]
    assert sessions.read(tmp_path) == [(URL, "t1")] and fake.unloaded == ["stuck_1", "model_2"]
    server(models={"t1": []})
    assert sessions.free(tmp_path) == [] and sessions.read(tmp_path) == []


def test_a_server_without_the_route_cannot_be_asked_and_the_tag_is_dropped(tmp_path, server):
    fake = server(models={}, route=False)
    (tmp_path / sessions.FILE).write_text(f"{URL} t1\n")
    assert sessions.free(tmp_path) == [] and fake.unloaded == []
    assert sessions.read(tmp_path) == []


def test_every_loop_command_frees_what_a_killed_one_left_before_it_starts(tmp_path, server, capsys):
    folder = tmp_path / "loop"
    commands.init(commands.InitOptions(dir=str(folder), traces=str(tmp_path / "*.jsonl"), base_url=URL))
    fake = server(models={"rlcli-loop-killed": ["session_k:train:0"]})
    (folder / sessions.FILE).write_text(f"{URL} rlcli-loop-killed\n")  # a `loop run` killed mid-creation
    with commands.locked(folder):
        assert fake.unloaded == ["session_k:train:0"]
        [(url, tag)] = sessions.read(folder)  # this command's own tag, in the sessions it opens
        assert url == URL and tag in os.environ[sessions.TAGS_ENV]
    assert sessions.TAGS_ENV not in os.environ or tag not in os.environ[sessions.TAGS_ENV]
    assert "freed 1 server LoRA slot a killed command left (session_k:train:0)" in capsys.readouterr().err


def test_a_tenant_key_cannot_list_sessions_by_tag():
    """The route lists sessions whoever made them: on a server with --tenants only its own key may ask."""
    from tests.unit.test_tenant_fair_unit import runtime

    assert TAGGED_MODELS_ROUTE in runtime("rlcli_tenants").ADMIN
