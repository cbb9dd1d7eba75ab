"""Buffers a checkpoint carries that the model's config derives: left out of a build, by name.

PyTorch saves a module's persistent *buffers* beside its parameters. Some are
pure functions of the config, and converters drop them by name (docs:
/work/shared/DESIGN.md 6): llama.cpp's ``convert_hf_to_gguf.py`` skips every
name ending ``.attention.masked_bias``, ``.attention.bias`` or
``.rotary_emb.inv_freq``, its GPT-2 converter ``.attn.bias`` and
``.attn.masked_bias``, its BERT converter ``embeddings.position_ids``; mlx-lm's
``sanitize`` drops ``rotary_emb.inv_freq``. vLLM's GPT-2 loader notes that
``c_attn.bias`` is a real parameter: the patterns below are anchored on a dot,
so it does not match.

:data:`RULES` is the one table: a name pattern (searched in the source name),
a guard on dtype and shape that the buffer must also pass (so a learned tensor
that happens to share a name is carried, not dropped), and the reason it is
derivable, which the build prints and the pack records in
``provenance.skipped``.
"""
from __future__ import annotations

import math
import re
from typing import Callable

from .base import Skipped

# (pattern, guard(dtype, shape), reason)
RULES: tuple[tuple[re.Pattern, Callable[[str, tuple[int, ...]], bool], str], ...] = (
    (re.compile(r"(?:^|\.)position_ids$"),
     lambda dt, sh: len(sh) <= 2,  # I64 normally; some old CLIP checkpoints hold them as F32
     "position indices 0..n-1 (BERT-style buffer): arange(max_position_embeddings)"),
    (re.compile(r"(?:^|\.)(?:rotary_emb|rotary_pos_emb)\.inv_freq$"),  # rotary_pos_emb: ChatGLM3
     lambda dt, sh: len(sh) == 1,
     "RoPE inverse frequencies: 1 / rope_theta ** (arange(0, head_dim, 2) / head_dim)"),
    (re.compile(r"(?:^|\.)(?:attn|attention)\.bias$"),
     lambda dt, sh: len(sh) >= 2 and sh[-1] == sh[-2],
     "causal attention mask (GPT-2-style buffer): tril(ones(n_positions, n_positions))"),
    (re.compile(r"(?:^|\.)(?:attn|attention)\.masked_bias$"),
     lambda dt, sh: math.prod(sh) <= 1,
     "masked-attention fill value (GPT-2-style buffer): the constant -1e4"),
)


def derivable_reason(name: str, dtype: str, shape: tuple[int, ...]) -> str | None:
    """Why the source tensor ``name`` is derivable from the config, or None (it is carried)."""
    shape = tuple(shape)
    for pattern, guard, reason in RULES:
        if pattern.search(name) and guard(dtype, shape):
            return reason
    return None


def split_derivable(entries, key=lambda e: (e[0], e[1], tuple(e[2])),
                    family_skip: tuple[tuple[str, str], ...] = ()) -> tuple[list, list[Skipped]]:
    """(entries to keep, skipped buffers sorted by name); ``key(entry)`` gives (source name, dtype, shape).

    ``family_skip``: the family's own (regex, why) pairs (orkpack/archs.py ``Family.skip``: a multimodal release's
    vision tower), left out and listed the same way."""
    kept, skipped = [], []
    rules = [(re.compile(rx), why) for rx, why in family_skip]
    for e in entries:
        name, dtype, shape = key(e)
        why = next((w for rx, w in rules if rx.search(name)), None) or derivable_reason(name, dtype, shape)
        if why is None:
            kept.append(e)
        else:
            skipped.append(Skipped(name, dtype, tuple(int(d) for d in shape), why))
    skipped.sort(key=lambda s: _natural(s.name))
    return kept, skipped


def _natural(name: str) -> tuple:
    from .names import natural_key

    return natural_key(name)
