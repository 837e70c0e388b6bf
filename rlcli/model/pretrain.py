"""A short pretraining run that turns the embedded model's random weights into a usable starting point.

Random weights never close a turn or answer in any format, so RL rewards are flat, and a LoRA on them
got the SFT loss no lower than ~5.1 nats. A few hundred full-model AdamW steps on
ChatML chats this module writes itself teach the turn structure (`<|im_start|>assistant\\n ...
<|im_end|>`), greetings, a few facts, one-digit sums, and the magnitude of bigger ones: a reward
signal for RL, and most of two-digit addition still left for it to learn.

Reproducibility: data from `random.Random(seed)`, weights from `torch.manual_seed(seed)` (the caller)
and a generator seeded the same way here, deterministic kernels, and a pinned thread count (THREADS). That makes
the bytes repeat on one machine, not across processors (float kernels differ between CPU models), which is why
rlcli ships the bytes this recipe made (rlcli/assets/) and serves those everywhere.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import re
import sys
import time
from collections.abc import Iterator
from typing import Any

# One thread, whatever the machine. CPU kernels may split reductions by thread count, so a fixed count
# keeps the bytes independent of the core count; and one thread never stalls when the build shares its
# cores: on a busy 2-core machine, 2 threads ran a training step 3-10x slower than 1 thread.
THREADS = 1
STEPS = 1000  # 70-80 s on one core of the 2-core dev machine; the marker records the real time
ROWS, ROW_LEN = 8, 64  # 512 tokens a step (~75 ms); 4 rows of 128 learned no better and ran slower
# Cosine from PEAK_LR to MIN_LR after a linear warmup. One-digit accuracy over seeds 0-3: 81-88% at
# 6e-3, 52-80% at 8e-3, 66-88% at 4.5e-3.
PEAK_LR, MIN_LR, WARMUP = 6e-3, 4e-4, 20
WEIGHT_DECAY = 0.01
# The (tied) token embeddings start larger than the other weights (ARCH's initializer_range). Drawn
# as small as those, sums sat on a plateau for most of the budget (early trials, 550 steps of sums
# only: one-digit accuracy 9-69% across four seeds; 86-97% with std 0.2).
EMBED_STD = 0.2
# Replies (and their <|im_end|>) carry full loss. Prompt tokens count half: without them the operands
# were found much later (early trials, 600 steps: one-digit accuracy 9-11% instead of 25-39%).
PROMPT_WEIGHT = 0.5
LOG_EVERY = 50
MAX_OPERAND = 100  # tinker-cookbook's arithmetic env draws x and y from 0..100
SMALL_SHARE = 0.7  # problems with two one-digit operands: the facts every bigger sum is built from
MIX = {  # kinds of training chat, by share
    "drill": 0.5,  # several cookbook-shaped problems in one chat: the env's few-shot shape, dense
    "cookbook": 0.15,  # exactly the env's prompt: its "4 + 5" few-shot turn, then the question
    "cookbook_zero_shot": 0.03,
    "demo": 0.15,  # `rlcli demo`'s shape: "What is 12 + 7?" -> "12 + 7 = 19."
    "variant": 0.03,
    "greeting": 0.06,  # a few fixed replies each: learned long before the sums are
    "fact": 0.06,
    "two_turns": 0.02,
}

SYSTEM_PROMPTS = ["You are a helpful assistant.", "Be brief.", "Answer with a number."]
# The few-shot turn tinker-cookbook's ArithmeticEnv puts before every question (standard_fewshot_prefix).
FEWSHOT = [{"role": "user", "content": "What is 4 + 5?"}, {"role": "assistant", "content": "9"}]
THINK = "<think>\n\n</think>\n\n"  # the qwen3_disable_thinking renderer ends its prompts with this
# `rlcli demo` trains on "Say hello." and "What colour is the sky?": they stay out of the corpus, so the
# demo shows a LoRA learning something new rather than reciting.
GREETINGS = [
    ("Hello!", "Hello! How can I help you today?"),
    ("Hi", "Hi! How can I help?"),
    ("Good morning.", "Good morning! How can I help you today?"),
    ("Thanks!", "You are welcome."),
    ("Thank you.", "You are welcome!"),
    ("Who are you?", "I am a small helpful assistant."),
    ("How are you?", "I am well, thank you. How can I help?"),
    ("Goodbye.", "Goodbye! Have a good day."),
]
FACTS = [
    ("What colour is grass?", "Grass is green."),
    ("What colour is snow?", "Snow is white."),
    ("What is the capital of France?", "The capital of France is Paris."),
    ("How many days are in a week?", "There are 7 days in a week."),
    ("How many legs does a dog have?", "A dog has 4 legs."),
    ("What is water made of?", "Water is made of hydrogen and oxygen."),
    ("Is the sun a star?", "Yes, the sun is a star."),
    ("What do cats say?", "Cats say meow."),
    ("How many hours are in a day?", "There are 24 hours in a day."),
    ("What is the opposite of hot?", "The opposite of hot is cold."),
]
# In the env's own prompt shape, this share of the replies talks its way to the sum (env_reply) instead of
# giving it bare: a base model with a habit that RL can see and unlearn. Under a small token budget (the
# notebooks' --max-tokens 8) a wordy reply is cut off before its answer and earns nothing, so GSPO shifts the
# model to bare answers, and that choice is made before any digit: it carries to problems RL never trained on.
WORDY_SHARE = 0.5
WORDY = [
    "Let me add {x} and {y} step by step and check it once more: the sum is {s}.",
    "We start from {x}, then count on by {y}, and so we get {s} in the end.",
    "Adding the two numbers {x} and {y} together, one at a time, gives {s}.",
]
Chat = list[dict[str, str]]


def env_reply(x: int, y: int, rng: random.Random) -> str:
    """A reply in the env's prompt shape: the bare sum, or (WORDY_SHARE of them) a sentence ending in it."""
    return rng.choice(WORDY).format(x=x, y=y, s=x + y) if rng.random() < WORDY_SHARE else str(x + y)


def is_heldout(x: int, y: int) -> bool:
    """A sum with a two-digit operand that no training chat may show: this module's own held-out set
    (scored after the build), and every pair `rlcli train rl --dataset arithmetic` can hold out.

    One-digit sums are 100 facts to learn, not to generalise to, so none is held out.
    """
    return max(x, y) >= 10 and (_scored_heldout(x, y) or (min(x, y), max(x, y)) in _rl_heldout())


def _scored_heldout(x: int, y: int) -> bool:
    """About 2% of the pairs with a two-digit operand: the build's two-digit accuracy is measured on them.

    The hash is multiplicative: a linear rule such as (101x + y) % 50 would hold out whole sums (x + y = 57, ...).
    """
    return max(x, y) >= 10 and (x * 1000 + y) * 2654435761 % 2**32 % 50 == 0


@functools.cache
def _rl_heldout() -> frozenset[tuple[int, int]]:
    """The pairs train rl's held-out draw can reach on its default range (unordered, as it compares them),
    so that its evaluation is on sums the model never saw."""
    from rlcli.problems.heldout import ARITHMETIC_EVAL_MAX, arithmetic_eval_pairs, pair_key

    return frozenset(pair_key(x, y) for x, y in arithmetic_eval_pairs(ARITHMETIC_EVAL_MAX))


def heldout_pairs() -> list[tuple[int, int]]:
    return [(x, y) for x in range(100) for y in range(100) if _scored_heldout(x, y)]


def kept_away() -> dict[str, Any]:
    """The sums no pretraining chat shows (is_heldout), as the model's record names them: how many, the first
    few, and a digest of the whole set. A model built against another set must not be served as this one."""
    pairs = [(x, y) for x in range(100) for y in range(100) if is_heldout(x, y)]
    digest = hashlib.sha256(json.dumps(pairs, separators=(",", ":")).encode()).hexdigest()
    return {"problems": len(pairs), "first": [list(p) for p in pairs[:5]], "sha256": digest}


def cookbook_chat(x: int, y: int, fewshot: bool = True) -> Chat:
    """An ArithmeticEnv episode (render it with think=True), answered with the bare sum."""
    return [*(FEWSHOT if fewshot else []), {"role": "user", "content": f"What is {x} + {y}?"},
            {"role": "assistant", "content": str(x + y)}]


def demo_chat(x: int, y: int) -> Chat:
    return [{"role": "user", "content": f"What is {x} + {y}?"},
            {"role": "assistant", "content": f"{x} + {y} = {x + y}."}]


def heldout_chats() -> list[tuple[Chat, bool]]:
    """(chat, think) pairs no training chat repeats: unseen sums in both shapes, and the demo's two questions."""
    chats = [(cookbook_chat(x, y), True) for x, y in heldout_pairs()[::10]]
    chats += [(demo_chat(x, y), False) for x, y in heldout_pairs()[5::10]]
    for question, answer in (("Say hello.", "Hello! How can I help you today?"),
                             ("What colour is the sky?", "The sky is blue on a clear day.")):
        chats.append(([{"role": "user", "content": question}, {"role": "assistant", "content": answer}], False))
    return chats


def _operands(rng: random.Random) -> tuple[int, int]:
    while True:
        top = 9 if rng.random() < SMALL_SHARE else MAX_OPERAND
        x, y = rng.randint(0, top), rng.randint(0, top)
        if not is_heldout(x, y):
            return x, y


def _chat(rng: random.Random) -> tuple[Chat, bool]:
    """One training chat, and whether it is rendered as the RL renderer does (empty think block)."""
    kind = rng.choices(list(MIX), list(MIX.values()))[0]
    x, y = _operands(rng)
    s = x + y
    if kind == "drill":
        messages: Chat = []
        for _ in range(rng.randint(2, 6)):
            a, b = _operands(rng)
            messages += cookbook_chat(a, b, fewshot=False)
            messages[-1]["content"] = env_reply(a, b, rng)
        return messages, True
    if kind in ("cookbook", "cookbook_zero_shot"):
        messages = cookbook_chat(x, y, fewshot=kind == "cookbook")
        messages[-1]["content"] = env_reply(x, y, rng)
        return messages, True
    if kind == "demo":
        messages = demo_chat(x, y)
    elif kind == "two_turns":  # a greeting, then a question that needs nothing from it
        messages = [*_qa(rng.choice(GREETINGS)), *demo_chat(x, y)]
    elif kind == "greeting":
        messages = _qa(rng.choice(GREETINGS))
    elif kind == "fact":
        messages = _qa(rng.choice(FACTS))
    else:
        messages = _qa(rng.choice([
            (f"What is {x} plus {y}?", str(s)),
            (f"Compute {x} + {y}.", f"{x} + {y} = {s}."),
            (f"Add {x} and {y}.", f"The sum is {s}."),
            (f"What is the sum of {x} and {y}?", f"The answer is {s}."),
        ]))
    if rng.random() < 0.3:
        messages.insert(0, {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    return messages, False


def _qa(pair: tuple[str, str]) -> Chat:
    return [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]


def render(tokenizer: Any, messages: Chat, think: bool = False,
           generation_prompt: bool = False) -> tuple[list[int], list[float]]:
    """ChatML tokens as the chat template writes them (think=True: as with enable_thinking=False), with
    a loss weight per token: 1 for replies and their <|im_end|>, PROMPT_WEIGHT for the rest.

    Pieces are encoded one by one, as the cookbook renderers and `rlcli demo` do; the tests check the
    result against `apply_chat_template` token for token.
    """
    pieces: list[tuple[str, float]] = []
    for i, m in enumerate(messages):
        w = 1.0 if m["role"] == "assistant" else PROMPT_WEIGHT
        pieces.append((f"<|im_start|>{m['role']}\n", PROMPT_WEIGHT))
        if think and w == 1.0 and i == len(messages) - 1:
            pieces.append((THINK, 0.0))  # part of the prompt: a reply never starts it by itself
        pieces += [(m["content"], w), ("<|im_end|>", w), ("\n", PROMPT_WEIGHT)]
    if generation_prompt:
        pieces.append(("<|im_start|>assistant\n" + (THINK if think else ""), 0.0))
    encoded = tokenizer([text for text, _ in pieces], add_special_tokens=False)["input_ids"]
    tokens = [t for ids in encoded for t in ids]
    weights = [w for ids, (_, w) in zip(encoded, pieces, strict=True) for _ in ids]
    return tokens, weights


def _rows(tokenizer: Any, rng: random.Random) -> Iterator[tuple[list[int], list[float]]]:
    """Chats packed end to end, each closed by <|endoftext|>, cut into rows of ROW_LEN + 1 tokens."""
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    tokens: list[int] = []
    weights: list[float] = []
    while True:
        while len(tokens) < ROW_LEN + 1:
            ids, ws = render(tokenizer, *_chat(rng))
            tokens += [*ids, eot]
            weights += [*ws, PROMPT_WEIGHT]
        yield tokens[: ROW_LEN + 1], weights[: ROW_LEN + 1]
        # The next row starts at this one's last token, which here was only a target.
        tokens, weights = tokens[ROW_LEN:], weights[ROW_LEN:]


def _lr(step: int, steps: int) -> float:
    if step < WARMUP:
        return PEAK_LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / max(1, steps - WARMUP)
    return MIN_LR + 0.5 * (PEAK_LR - MIN_LR) * (1 + math.cos(math.pi * progress))


def greedy(model: Any, prompts: list[list[int]], max_new: int, stop: set[int]) -> list[list[int]]:
    """Greedy completions (stop token included), batched by prompt length so no padding is needed."""
    import torch

    out: list[list[int]] = [[] for _ in prompts]
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    with torch.no_grad():
        for indices in by_len.values():
            ids, past = torch.tensor([prompts[i] for i in indices]), None
            for _ in range(max_new):
                result = model(input_ids=ids, past_key_values=past, use_cache=True)
                past, ids = result.past_key_values, result.logits[:, -1].argmax(-1, keepdim=True)
                for row, i in enumerate(indices):
                    if not out[i] or out[i][-1] not in stop:
                        out[i].append(int(ids[row, 0]))
                if all(out[i][-1] in stop for i in indices):
                    break
    return out


def arithmetic_accuracy(model: Any, tokenizer: Any) -> dict[str, float]:
    """Exact greedy answers, graded as the cookbook grades (the last integer, here also a closed turn):
    the 100 one-digit sums and the held-out two-digit ones in the env's prompt, held-out ones in the demo's,
    with room for a wordy reply to finish; and the share of one-digit replies that were bare (3 tokens at most)."""
    stop = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    one_digit = [(x, y) for x in range(10) for y in range(10)]
    scores: dict[str, float] = {}
    for name, build, think, pairs in (("one_digit", cookbook_chat, True, one_digit),
                                      ("two_digit_heldout", cookbook_chat, True, heldout_pairs()),
                                      ("demo_heldout", demo_chat, False, heldout_pairs())):
        prompts = [render(tokenizer, build(x, y)[:-1], think, generation_prompt=True)[0] for x, y in pairs]
        right = bare = 0
        for (x, y), ids in zip(pairs, greedy(model, prompts, 40, stop), strict=True):
            text = tokenizer.decode(ids)
            numbers = re.findall(r"-?\d+", text)
            right += text.endswith("<|im_end|>") and bool(numbers) and int(numbers[-1]) == x + y
            bare += len(ids) <= 3
        scores[name] = round(right / len(pairs), 4)
        if name == "one_digit":
            scores["one_digit_bare_share"] = round(bare / len(pairs), 4)
    return scores


def reply_loss(model: Any, tokenizer: Any, chats: list[tuple[Chat, bool]]) -> float:
    """Mean negative log-likelihood (nats) per reply token, <|im_end|> included."""
    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    with torch.no_grad():
        for messages, think in chats:
            tokens, weights = render(tokenizer, messages, think)
            ids = torch.tensor([tokens])
            nll = F.cross_entropy(model(input_ids=ids[:, :-1]).logits[0], ids[0, 1:], reduction="none")
            mask = torch.tensor(weights[1:]) == 1.0
            total, count = total + nll[mask].sum().item(), count + int(mask.sum())
    return total / count


def pretrain(model: Any, tokenizer: Any, seed: int, quiet: bool = False, steps: int = STEPS) -> dict[str, Any]:
    """Train every weight of `model` in place on the synthetic chats; return what the marker records.

    `steps` below STEPS only serves tests of the recipe (same code path, a fraction of the time)."""
    import torch
    import torch.nn.functional as F

    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    start = time.monotonic()
    try:
        with torch.no_grad():
            generator = torch.Generator().manual_seed(seed)
            model.get_input_embeddings().weight.normal_(0.0, EMBED_STD, generator=generator)
        decay = [p for p in model.parameters() if p.ndim >= 2]
        norms = [p for p in model.parameters() if p.ndim < 2]  # RMSNorm gains: no weight decay
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                 {"params": norms, "weight_decay": 0.0}], lr=PEAK_LR, betas=(0.9, 0.98))
        rows = _rows(tokenizer, random.Random(seed))
        model.train()
        recent: list[float] = []
        for step in range(steps):
            batch = [next(rows) for _ in range(ROWS)]
            tokens = torch.tensor([t for t, _ in batch])
            weights = torch.tensor([w[1:] for _, w in batch])
            logits = model(input_ids=tokens[:, :-1], use_cache=False).logits
            nll = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
            loss = (nll * weights.flatten()).sum() / weights.sum()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            for group in opt.param_groups:
                group["lr"] = _lr(step, steps)
            opt.step()
            opt.zero_grad(set_to_none=True)
            recent = [*recent[-19:], loss.item()]
            if not quiet and ((step + 1) % LOG_EVERY == 0 or step + 1 == steps):
                print(f"rlcli: pretraining step {step + 1}/{steps}  loss {loss.item():.3f}  "
                      f"({time.monotonic() - start:.1f} s)", file=sys.stderr, flush=True)
        model.eval()
        seconds = time.monotonic() - start
        accuracy = arithmetic_accuracy(model, tokenizer)
        heldout = reply_loss(model, tokenizer, heldout_chats())
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    return {
        "steps": steps,
        "tokens": steps * ROWS * ROW_LEN,
        "threads": THREADS,
        "seconds": round(seconds, 1),
        "final_loss": round(sum(recent) / len(recent), 4),  # weighted training loss, mean of the last 20 steps
        "heldout_reply_loss": round(heldout, 4),
        "arithmetic_accuracy": accuracy,
        "heldout_problems": len(heldout_pairs()),
    }
