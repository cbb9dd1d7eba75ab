"""A reference forward pass in numpy (float32), declared per family in :mod:`orkpack.archs`.

``logits(path, tokens)`` gives the (T, vocab) logits of a checkpoint (HF folder, .safetensors or
.gguf); ``run(source, tokens, weights=...)`` runs it over an opened source with any weight
provider (:mod:`orkpack.model.weights`): every matmul goes through the provider, so the same pass
runs a pack's weights under the board's numerics. A family the pass does not implement raises
:class:`NotEvaluable` with one line naming what is missing.
"""
from .forward import logits, model_hparams, run
from .hparams import Hparams, NotEvaluable
from .weights import SourceWeights, Weights, matmul_rows

__all__ = ["logits", "model_hparams", "run", "Hparams", "NotEvaluable", "SourceWeights", "Weights", "matmul_rows"]
