"""What a sequence's forward pass leaves for its next tokens: the KV cache and the recurrent states.

``forward.run(..., state=State())`` runs the tokens as the continuation of whatever the state holds (their
positions start at ``state.pos``) and leaves the state advanced past them, so that

    run(ids[:n], state=s); run(ids[n:n+1], state=s); run(ids[n+1:n+2], state=s) ...

gives the same logits, row for row, as one ``run(ids)`` (tests/test_generate.py holds every family to it). The
state holds one slot (a dict) per layer and block, filled by the block that owns it:

* attention: ``k``, ``v`` (tokens, KV heads, head dim) as the scores read them (q/k-normed, RoPE-turned: post-norm,
  post-RoPE; MLA: the per-head keys with the shared RoPE part broadcast, and the values), and ``k0``, the absolute
  position of ``k[0]``. A sliding-window layer keeps only the last ``window - 1`` positions (what the next query can
  see), unless a KV-sharing layer with a longer reach reads it (Hparams.kv_from); a KV-sharing layer keeps nothing
  (it reads the earlier layer's cache).
* shortconv, deltanet, mamba2: ``conv``, the last K - 1 inputs of the depthwise causal convolution (its tail);
  deltanet's ``S`` (value heads, key dim, value dim) delta-rule state; mamba2's ``ssm`` (heads, head dim, state
  size), float64 as its scan runs.
* rwkv7's time mix: ``shift`` (the last normed input, for the token shift) and ``wkv`` (heads, head size, head
  size); its channel mix: ``shift``.

Everything else in the pass (norms, FFNs and experts, per-layer inputs, gemma3n's AltUp streams and LAuReL, the
head) is per token and carries nothing. A run that fails leaves the state unusable (partly advanced): start a new
one.
"""
from __future__ import annotations

import numpy as np


class State:
    """The KV cache and recurrent states of one sequence (see the module docstring)."""

    def __init__(self) -> None:
        self.pos = 0  # tokens the sequence holds so far: the next token's position
        self._slots: dict[tuple[int, str], dict] = {}

    def slot(self, layer: int, block: str) -> dict:
        """The slot of ``block`` ("attn", "mamba2", "channel_mix", ...) in ``layer``, created empty."""
        return self._slots.setdefault((layer, block), {})

    def nbytes(self) -> int:
        """Bytes of every array the state holds."""
        return sum(a.nbytes for s in self._slots.values() for a in s.values() if isinstance(a, np.ndarray))

    def __repr__(self) -> str:
        return f"State(pos={self.pos}, slots={len(self._slots)}, {self.nbytes()} bytes)"
