"""The text an eval (and ``orkpack imatrix``) runs on: the built-in prose or a user's text through the model's
tokenizer, or token ids as given."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import escape_name
from ..model.tokenizer import from_model
from .weights import EvalError

PROSE = Path(__file__).resolve().parents[1] / "data" / "eval" / "prose.txt"


def source_record(src) -> dict | None:
    """The model record (tokenizer, chat template, hyperparameters) of an opened source, or None."""
    if src.kind == "gguf":
        return src.model_metadata()
    from ..sources.modelkv import from_hf

    root = Path(src.root)
    return from_hf(root if root.is_dir() else root.parent, src.config)


def _read_ids(path: Path, vocab: int) -> np.ndarray:
    """Token ids from a file: whitespace- or comma-separated integers, or a JSON list."""
    where = escape_name(str(path))
    try:
        raw = Path(path).read_text(encoding="utf-8")
        ids = np.asarray([int(t) for t in raw.replace("[", " ").replace("]", " ").replace(",", " ").split()],
                         dtype=np.int64)
    except (OSError, UnicodeDecodeError, ValueError, OverflowError) as e:
        raise EvalError(f"{where}: not a list of token ids ({e.__class__.__name__}); give integers separated by "
                        "spaces") from None
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise EvalError(f"{where}: token id {int(ids.max() if ids.max() >= vocab else ids.min())} is outside the "
                        f"vocabulary (0..{vocab - 1})")
    return ids


def token_ids(text: Path | None, tokens: Path | None, record: dict | None, vocab: int,
              model_where: str) -> tuple[np.ndarray, int | None, str]:
    """(the token ids to score, the BOS id each chunk starts with or None, the text's name for messages):
    ``tokens`` as given, else ``text`` (default: the built-in prose) through the model's tokenizer."""
    if tokens is not None:
        return _read_ids(tokens, vocab), None, escape_name(str(tokens))
    tok = from_model(record, model_where)
    text_path = text or PROSE
    try:
        s = Path(text_path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise EvalError(f"{escape_name(str(text_path))}: cannot read the text ({e.__class__.__name__}); give a "
                        "UTF-8 text file") from None
    return np.asarray(tok.encode(s), dtype=np.int64), tok._bos, escape_name(str(text_path))
