"""Chat: the checkpoint's own template, rendered in jinja2's sandbox, and a session that
keeps the KV cache between turns instead of prefilling the whole history again."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from llama_np.api import LLM
from llama_np.errors import LlamaNpError, UsageError
from llama_np.generation.generate import Stats, generate
from llama_np.generation.sampling import Sampler, SamplerSettings


def render_chat(template: str | None, messages: list[dict[str, str]], bos: str, eos: str) -> str:
    """The prompt text for `messages`, ending where the assistant's answer begins, as
    transformers' apply_chat_template renders it (untrusted templates run sandboxed)."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if template is None:
        raise UsageError("this checkpoint has no chat template; use generate without --chat")

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.globals.update(
        raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f)
    )
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos
        )
    except jinja2.TemplateError as e:  # syntax errors, sandbox violations, raise_exception
        raise LlamaNpError(f"the chat template failed: {e}") from None


def chat_prompt_ids(llm: LLM, messages: list[dict[str, str]]) -> list[int]:
    """The token ids of `messages` in the checkpoint's chat template, ready for the reply."""
    tok = llm.tokenizer
    bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
    eos = tok.token_text(tok.eos_ids[0]) if tok.eos_ids else ""
    text = render_chat(tok.chat_template, messages, bos, eos)
    return tok.encode(text, bos=False)  # a template writes BOS itself when it wants one


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class ChatSession:
    """A conversation whose KV cache holds the tokens of every turn so far."""

    def __init__(self, llm: LLM, system: str | None = None, ctx: int | None = None,
                 window: int | None = None, kv: str = "f32", stop: Sequence[str] = (),
                 **sampling: Any) -> None:  # fmt: skip
        """`stop`: strings that end a reply (not kept in it), as generate's --stop."""
        self.llm = llm
        self.messages: list[dict[str, str]] = (
            [{"role": "system", "content": system}] if system else []
        )
        self.cache = llm.new_cache(ctx, window, kv)
        self.held: list[int] = []  # the tokens the cache holds, in order
        self.sampler = Sampler(SamplerSettings(**sampling))
        self.stop = list(stop)
        self._args = (ctx, window, kv)

    def prompt_ids(self) -> list[int]:
        return chat_prompt_ids(self.llm, self.messages)

    def send(self, text: str, n_predict: int = 512, stats: Stats | None = None) -> Iterator[str]:
        """Stream the assistant's reply to `text`; the turn is recorded when it ends."""
        if not text.strip():
            raise UsageError("the message is empty")
        self.messages.append({"role": "user", "content": text})
        ids = self.prompt_ids()
        keep = common_prefix(self.held, ids)
        if keep < len(self.held) and not self.cache.truncate(keep):
            self.cache, keep = self.llm.new_cache(*self._args), 0  # a ring cannot rewind
        stats = stats if stats is not None else Stats()
        reply = []
        pieces = generate(self.llm.model, self.llm.tokenizer, ids[keep:], self.cache, self.sampler,
                          n_predict, self.stop, stats)  # fmt: skip
        for piece in pieces:
            reply.append(piece)
            yield piece
        self.held = ids + stats.generated[: stats.decode_steps]
        self.messages.append({"role": "assistant", "content": "".join(reply)})
