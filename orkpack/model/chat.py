"""A model record's chat template (``tokenizer.chat_template``, docs/FORMAT.md 9) rendered as transformers renders it.

transformers' ``apply_chat_template`` (``transformers.utils.chat_template_utils``): a jinja2
``ImmutableSandboxedEnvironment`` (the template is untrusted code from the checkpoint) with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter that does not escape HTML, the globals
``raise_exception`` and ``strftime_now``; rendered with ``messages``, ``add_generation_prompt`` and the special
tokens (``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``) as variables. The rendered text is tokenized
without adding special tokens (the template writes them), as ``apply_chat_template(tokenize=True)`` does.

:func:`end_of_turn` finds the token a template closes an assistant turn with (``<|im_end|>``, ``<end_of_turn>``,
``<|eot_id|>``, ...): the text it renders right after an assistant message, when that text starts with a special
token.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Mapping

from ..errors import OrkError, escape_name
from ..pack.model import get

_MARK = "\u2063orkpack-end-of-turn\u2063"  # an assistant message no template alters


class ChatError(OrkError):
    pass


def special_tokens(model: Mapping | None) -> dict[str, str]:
    """The special tokens a template sees (bos_token, eos_token, unk_token, pad_token) that the record names."""
    tokens = get(model, "tokenizer.ggml.tokens")
    out = {}
    for var, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding")):
        tid = get(model, f"tokenizer.ggml.{key}_token_id")
        if isinstance(tokens, list) and isinstance(tid, int) and 0 <= tid < len(tokens):
            out[var] = tokens[tid]
    return out


def template(model: Mapping | None, where: str) -> str:
    """The record's chat template (ChatError when it has none)."""
    t = get(model, "tokenizer.chat_template")
    if not isinstance(t, str) or not t:
        raise ChatError(f"{where}: carries no chat template (tokenizer.chat_template); drop --chat and give the "
                        "prompt as the model should see it")
    return t


def _compiled(text: str, where: str):
    try:
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ChatError("--chat renders the chat template with jinja2: pip install jinja2") from None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(text), jinja2.exceptions.TemplateError
    except jinja2.exceptions.TemplateError as e:
        raise ChatError(f"{where}: its chat template does not parse ({escape_name(str(e), 120)}); "
                        "drop --chat") from None


def render(model: Mapping | None, messages: list[dict], where: str, add_generation_prompt: bool = True) -> str:
    """The conversation ``messages`` ([{"role": ..., "content": ...}]) through the record's chat template."""
    compiled, error = _compiled(template(model, where), where)
    try:
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               **special_tokens(model))
    except error as e:
        raise ChatError(f"{where}: its chat template refused the conversation ({escape_name(str(e), 120)})") from None


def end_of_turn(model: Mapping | None, tokenizer, where: str) -> int | None:
    """The id of the special token the template ends an assistant turn with, or None when it writes none."""
    try:
        text = render(model, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARK}], where,
                      add_generation_prompt=False)
    except ChatError:
        return None
    at = text.find(_MARK)
    if at < 0:
        return None
    after = tokenizer.encode(text[at + len(_MARK):], special=False)
    return after[0] if after and tokenizer.is_special(after[0]) else None
