"""A greedy batch decodes without drawing random numbers: SkyRL's decode loop (`GeneratorMixin._prefill_and_decode`)
draws a Gumbel sample for every row and every vocabulary entry at each step, then keeps the argmax for rows at
temperature 0. On CPU at 64 rows that draw was over a third of a step (docs/decisions.md, "Issue 48"). Here the draw
runs only when some row samples (`lax.cond` on the batch's temperatures), and the argmax is two plain reductions
(XLA's CPU argmax is a slow two-operand reduce). Same keys split each step, same tokens, same logprobs
(docs/upstream/greedy-decode.md).

`max_tokens` is bucketed too: SkyRL's loop takes the batch's largest `max_tokens` as a static argument, so every
distinct value compiled a program of its own (5-8 s on CPU, ~20 s on a GPU: an endpoint's clients each asking their
own `max_tokens` paid it again and again). Here the program is built for SkyRL's own length bucket of it (32, 48,
64, 96, ...) and the loop stops at the batch's true largest, a traced bound: the same steps, the same outputs.
"""

from __future__ import annotations

STATIC = ("max_length", "max_new_tokens", "max_top_k", "use_top_p", "prompt_logprobs")


def first_argmax(logits):
    """jnp.argmax over the last axis (the first of equal maxima; a NaN counts as the largest) as a max and a min:
    XLA's CPU backend runs argmax as a (value, index) reduce several times slower than these two."""
    import jax.numpy as jnp

    top = logits.max(axis=-1, keepdims=True)  # NaN if the row holds one
    hit = (logits == top) | jnp.isnan(logits)
    index = jnp.arange(logits.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(hit, index, logits.shape[-1]), axis=-1)


def next_tokens(logits, keys, temperatures, top_k, top_p, max_top_k: int, use_top_p: bool):
    """Each row's next token: its argmax at temperature 0, else a draw from its filtered, scaled logits."""
    import jax
    import jax.numpy as jnp
    from skyrl.tx.utils import generator

    greedy_rows = temperatures == 0.0
    greedy = first_argmax(logits)

    def draw():
        scaled = logits / jnp.where(greedy_rows, 1.0, temperatures)[:, None]
        if max_top_k > 0:
            scaled = generator.apply_top_k_batch(scaled, top_k, max_top_k)
        if use_top_p:
            scaled = generator.apply_top_p_batch(scaled, top_p)
        drawn = jax.vmap(lambda key, row: jax.random.categorical(key, row, axis=-1))(keys, scaled)
        return jnp.where(greedy_rows, greedy, drawn)

    return jax.lax.cond(jnp.all(greedy_rows), lambda: greedy, draw)


def prefill(model, input_ids, attention_mask, adapter_indices, prompt_logprobs: bool):
    """The prompt's forward: its KV cache, each row's logits after its last real token, the prompt's logprobs."""
    import jax.numpy as jnp

    out = model(input_ids, attention_mask=attention_mask, adapter_indices=adapter_indices)
    last = attention_mask.sum(axis=1) - 1  # prompts are left-aligned
    rows = jnp.arange(input_ids.shape[0])
    if not prompt_logprobs:  # the LM head on one position a row
        hidden = out.last_hidden_state[rows, last][:, None, :]
        return out.kv_cache, last, model.compute_logits(hidden, adapter_indices)[:, 0, :], None
    logits = model.compute_logits(out.last_hidden_state, adapter_indices)
    scores = model.logits_to_logprobs(logits[:, :-1, :], input_ids[:, 1:])
    return out.kv_cache, last, logits[rows, last, :], scores


def prefill_and_decode(model, input_ids, attention_mask, max_length: int, max_new_tokens: int, adapter_indices,
                       temperatures, rngs, stop_tokens, top_k_values, top_p_values, max_top_k: int, use_top_p: bool,
                       prompt_logprobs: bool = False, steps=None):
    """SkyRL's `_prefill_and_decode` contract (arguments, static names, outputs), its loop with `next_tokens`;
    `steps` (traced) stops the loop before `max_new_tokens` (static: the buffers' width)."""
    import jax
    import jax.numpy as jnp
    from skyrl.tx.utils.generator import DecodeState

    kv_cache, last, logits, scores = prefill(model, input_ids, attention_mask, adapter_indices, prompt_logprobs)
    width = max_length - attention_mask.shape[1]
    layers = model.get_decode_layers()  # sliced out of the stacked weights once, not every step
    rows = jnp.arange(input_ids.shape[0])

    def step(s: DecodeState) -> DecodeState:
        keys = jax.vmap(jax.random.split)(s.rngs)  # split as SkyRL does: a seed's draws stay the same
        token = next_tokens(s.logits, keys[:, 1], temperatures, top_k_values, top_p_values, max_top_k, use_top_p)
        stopped = jnp.any(token[:, None] == stop_tokens, axis=1)
        mask = s.attention_mask.at[rows, s.kv_cache.cache_position].set(1)
        out = model(token[:, None], attention_mask=mask, positions=s.last_positions + 1, kv_cache=s.kv_cache,
                    adapter_indices=adapter_indices, decode_layers=layers)
        return DecodeState(
            kv_cache=out.kv_cache, rngs=keys[:, 0], attention_mask=mask, last_positions=s.last_positions + 1,
            logits=model.compute_logits(out.last_hidden_state, adapter_indices)[:, 0, :],
            stop_pos=jnp.where((s.stop_pos == -1) & stopped, s.step + 1, s.stop_pos), step=s.step + 1,
            generated_tokens=s.generated_tokens.at[:, s.step].set(token),
            generated_logprobs=s.generated_logprobs.at[:, s.step].set(model.logits_to_logprobs(s.logits, token)))

    def going(s: DecodeState):
        return (s.step < (max_new_tokens if steps is None else steps)) & jnp.any(s.stop_pos == -1)

    n = input_ids.shape[0]
    start = DecodeState(
        kv_cache=kv_cache.pad_to_length(max_length), rngs=rngs,
        attention_mask=jnp.pad(attention_mask, ((0, 0), (0, width))), last_positions=last[:, None], logits=logits,
        stop_pos=jnp.full((n,), -1), step=jnp.int32(0),
        generated_tokens=jnp.zeros((n, max_new_tokens), dtype=jnp.int32),
        generated_logprobs=jnp.zeros((n, max_new_tokens), dtype=jnp.float32))
    end = jax.lax.while_loop(going, step, start)
    return end.generated_tokens, end.generated_logprobs, end.stop_pos, scores


installed: dict = {}  # "stock" and "rlcli": the mixin's staticmethods, one jitted function each per process


def bucketed(program):
    """`generate`'s call of the decode program, with `max_new_tokens` rounded up to SkyRL's length bucket and the
    true value passed as the loop's traced bound: one program a bucket. Outputs are wider than `max_new_tokens`;
    `generate` cuts each row at its own `max_tokens` (never above the true largest) or its stop."""
    import jax.numpy as jnp
    from skyrl.tx.utils.models import round_up_seq_len

    def call(model, input_ids, attention_mask, max_length, max_new_tokens, *rest, prompt_logprobs=False):
        return program(model, input_ids, attention_mask, max_length, round_up_seq_len(max_new_tokens), *rest,
                       prompt_logprobs=prompt_logprobs, steps=jnp.int32(max_new_tokens))

    return call


def install() -> None:
    """Rebind the mixin's jitted static method (`generate` calls it through `self`)."""
    import jax
    from skyrl.tx.utils.generator import GeneratorMixin

    if not installed:
        installed["stock"] = GeneratorMixin.__dict__["_prefill_and_decode"]
        installed["rlcli"] = staticmethod(bucketed(jax.jit(prefill_and_decode, static_argnames=STATIC)))
    GeneratorMixin._prefill_and_decode = installed["rlcli"]


def describe() -> dict:
    """What the capabilities route says (API process)."""
    return {"decode": "a batch at temperature 0 takes each row's argmax without drawing a sample; one program per "
                      "max_tokens bucket"}
