"""`rlcli sample` and `rlcli chat`: completions from a sampler checkpoint or the base model.

Launch:  rlcli sample --checkpoint tinker://RUN/sampler_weights/ID --prompt "What is 2 + 3?" [--n 4]
         rlcli sample --prompt "Hello"                      (the server's base model)
         rlcli chat --checkpoint tinker://RUN/sampler_weights/ID  (one turn per line; /exit or EOF ends)
         printf 'hi\\nWhat is 2 + 3?\\n' | rlcli chat          (works from a pipe)

The prompt is rendered with the model's own chat template. The tokenizer is the base model the server
reports for the checkpoint's run (a local folder loads offline; a hub id comes from the HF cache first).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcli.client import NOT_LOADED, parse_tinker_path, server_base_model, training_run, unload_model
from rlcli.config import ensure_api_key, resolve_base_url
from rlcli.errors import RlcliError, UsageError, debug_enabled
from rlcli.options import CHECKPOINT, MAX_TOKENS, MODEL, SEED, TEMPERATURE, ServerOptions, option
from rlcli.watchdog import watch

# Tokens that end an assistant turn in the chat templates rlcli meets (ChatML, Llama 3, Gemma).
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>")


@dataclass
class Sampler:
    """A sampling client with what a turn needs: tokenizer, parameters, a name for messages."""

    client: Any
    tokenizer: Any
    params: Any
    source: str
    base_url: str
    history: list[dict[str, str]] = field(default_factory=list)
    reloaded_model_id: str | None = None  # a model rlcli loaded to serve an unloaded checkpoint; freed at the end
    base_model: str = ""  # what the server calls the checkpoint's base model (its tokenizer's name)
    slot_wait_s: float = 0.0  # how long a reload may wait for a free LoRA slot (rlcli.slot_wait)


def load_tokenizer(name: str) -> Any:
    """A local folder offline; a hub id from the HF cache, else the hub."""
    from transformers import AutoTokenizer

    path = Path(name).expanduser()
    if path.is_dir():
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if name.startswith(("/", "~", ".")):
        raise UsageError(f"the base model {name} is not a folder on this machine (the server's path): pass "
                         "--tokenizer with a local copy of it or its Hugging Face id")
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except OSError:
        return AutoTokenizer.from_pretrained(name)


def stop_tokens(tokenizer: Any) -> list[int]:
    """Ids that end a reply: the tokenizer's eos and any end-of-turn token its vocabulary has."""
    vocab = tokenizer.get_vocab()
    return sorted({vocab[t] for t in (tokenizer.eos_token, *END_OF_TURN) if t in vocab})


def _model_for(url: str, checkpoint: str | None, model: str | None) -> str:
    """The base model whose tokenizer renders the prompt, checked against what the server serves."""
    if checkpoint and model:
        raise UsageError("give --checkpoint or --model, not both (a checkpoint knows its base model)")
    if checkpoint:
        run_id, kind, _ = parse_tinker_path(checkpoint)
        if kind == "weights":
            raise UsageError(f"{checkpoint} is a training checkpoint; sample from sampler weights: "
                             "save_weights_for_sampler gives a tinker://RUN/sampler_weights/ID path")
        return training_run(url, run_id)["base_model"]
    served = server_base_model(url)
    if model and model != served:
        raise UsageError(f"the server at {url} serves {served!r}, not {model!r}: pass --model {served} "
                         "or start a server with that model")
    return served


def open_sampler(checkpoint: str | None, model: str | None, base_url: str | None, tokenizer: str | None,
                 max_tokens: int, temperature: float, seed: int, slot_wait_s: float = 0.0) -> Sampler:
    import logging

    url = resolve_base_url(base_url)
    ensure_api_key()
    try:
        base = _model_for(url, checkpoint, model)
    except OSError as e:
        raise RlcliError(f"cannot reach the server at {url} ({e}): is it running? (`rlcli serve status`)") from None
    import tinker  # ~3 s of imports: after the checks above, so a bad path or no server is one line at once

    if not debug_enabled():  # tinker logs each failed request itself; the error below says it once
        logging.getLogger("tinker").setLevel(logging.CRITICAL)
    tok = load_tokenizer(tokenizer or base)
    params = tinker.SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, stop=stop_tokens(tok))
    service = tinker.ServiceClient(base_url=url)
    if checkpoint:
        run_id, _, ckpt = parse_tinker_path(checkpoint)
        client = service.create_sampling_client(model_path=f"tinker://{run_id}/sampler_weights/{ckpt}").result()
    else:
        client = service.create_sampling_client(base_model=base).result()
    return Sampler(client, tok, params, checkpoint or base, url, base_model=base, slot_wait_s=slot_wait_s)


def complete(s: Sampler, messages: list[dict[str, str]], n: int = 1) -> list[str]:
    """n completions of the chat, rendered with the tokenizer's chat template."""
    import tinker

    text = s.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = tinker.ModelInput.from_ints(s.tokenizer.encode(text, add_special_tokens=False))
    for attempt in range(2):
        try:
            result = s.client.sample(prompt=prompt, num_samples=n, sampling_params=s.params).result()
            break
        except Exception as e:  # tinker raises its own classes; the server's reason is in the message
            if attempt or NOT_LOADED not in str(e) or not _reload(s):
                raise _sampling_error(s, e) from None
    return [s.tokenizer.decode(seq.tokens, skip_special_tokens=True).strip() for seq in result.sequences]


def _reload(s: Sampler) -> bool:
    """Serve a checkpoint whose model is gone (a finished run unloads it) from the run's training state.

    Training runs save state and sampler weights under one name (tinker://RUN/weights/NAME beside
    tinker://RUN/sampler_weights/NAME): load that state into a new model and save it for the sampler, waiting up to
    s.slot_wait_s for a free LoRA slot (NoFreeSlot, one line, when none frees).
    """
    import tinker

    from rlcli.slot_wait import load_state

    run_id, _, ckpt = parse_tinker_path(s.source)
    service = tinker.ServiceClient(base_url=s.base_url)
    try:
        trainer = load_state(service, f"tinker://{run_id}/weights/{ckpt}", s.base_url, s.slot_wait_s)
    except tinker.APIStatusError as e:  # the server refused: no training state of that name
        if e.status_code in (401, 403):  # not a missing state: say what really went wrong
            raise
        return False  # the "not loaded" message says what to do
    s.reloaded_model_id = trainer.model_id
    print(f"rlcli: {s.source} was no longer loaded; serving it again from tinker://{run_id}/weights/{ckpt}",
          file=sys.stderr)
    s.client = trainer.save_weights_and_get_sampling_client().result()
    return True


def close(s: Sampler) -> None:
    if s.reloaded_model_id:
        unload_model(s.base_url, s.reloaded_model_id)
        s.reloaded_model_id = None


def _sampling_error(s: Sampler, e: Exception) -> RlcliError:
    if NOT_LOADED not in str(e):
        return RlcliError(f"sampling from {s.source} failed: {str(e).splitlines()[0]}")
    run_id = parse_tinker_path(s.source)[0]
    return RlcliError(
        f"{s.source} is not loaded: its run's model was unloaded (or timed out, or the server restarted) after the "
        f"save. Load a training checkpoint of the run (`rlcli checkpoint list --run-id {run_id}`) with "
        "create_training_client_from_state, save_weights_for_sampler and sample the new path; or `rlcli export` it")


def _messages(system: str | None, history: list[dict[str, str]]) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system else []) + history


@dataclass(frozen=True, kw_only=True)
class ChatOptions(ServerOptions):
    """`rlcli chat`'s options (and `rlcli sample`'s, with its prompt)."""

    checkpoint: str | None = CHECKPOINT(None)
    model: str | None = MODEL(None)
    system: str | None = option(None, "an optional system message")
    max_tokens: int = MAX_TOKENS(256)
    temperature: float = TEMPERATURE(0.7)
    seed: int = SEED(0)
    tokenizer: str | None = option(None, "local folder or hub id of the tokenizer, when the server's base model is "
                                         "not on this machine")


@dataclass(frozen=True, kw_only=True)
class SampleOptions(ChatOptions):
    prompt: str | None = option(None, "the user message")
    n: int = option(1, "how many completions", low=1)

    def problems(self) -> Iterator[str]:
        if not self.prompt:
            yield "--prompt TEXT is required (`rlcli chat` talks turn by turn)"


def sample(o: SampleOptions) -> int:
    """Sample completions for one prompt, rendered with the model's chat template."""
    with watch(resolve_base_url(o.base_url), o.server_timeout):
        s = open_sampler(o.checkpoint, o.model, o.base_url, o.tokenizer, o.max_tokens, o.temperature, o.seed)
        try:
            completions = complete(s, _messages(o.system, [{"role": "user", "content": str(o.prompt)}]), o.n)
        finally:
            close(s)
    for i, text in enumerate(completions):
        if o.n > 1:
            print(f"--- completion {i + 1}/{o.n}")
        print(text)
    return 0


def chat(o: ChatOptions) -> int:
    """Chat turn by turn: each stdin line is a user message; /reset clears the history, /exit or EOF ends."""
    with watch(resolve_base_url(o.base_url), o.server_timeout):
        return _chat(o.checkpoint, o.model, o.system, o.max_tokens, o.temperature, o.seed, o.base_url, o.tokenizer)


def _chat(checkpoint: str | None, model: str | None, system: str | None, max_tokens: int, temperature: float,
          seed: int, base_url: str | None, tokenizer: str | None) -> int:
    s = open_sampler(checkpoint, model, base_url, tokenizer, max_tokens, temperature, seed)
    tty = sys.stdin.isatty()
    if tty:
        print(f"chatting with {s.source} (/reset clears the history, /exit or Ctrl-D ends)", file=sys.stderr)
    try:
        while (line := _read_turn(tty)) is not None and line.strip() not in ("/exit", "/quit"):
            if line.strip() == "/reset":
                s.history.clear()
            elif line.strip():
                s.params = s.params.model_copy(update={"seed": seed + len(s.history) // 2})
                s.history.append({"role": "user", "content": line.strip()})
                reply = complete(s, _messages(system, s.history))[0]
                s.history.append({"role": "assistant", "content": reply})
                print(f"assistant: {reply}", flush=True)
    finally:
        close(s)
    return 0


def _read_turn(tty: bool) -> str | None:
    """One user line; None at EOF. A pipe gets no prompt, so its output holds only the replies."""
    try:
        return input("you: ") if tty else (sys.stdin.readline() or None)
    except EOFError:
        return None
