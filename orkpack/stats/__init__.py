"""Activation statistics of a model's matrix products: llama.cpp's importance matrix, and per-column maxima.

``orkpack imatrix SOURCE -o stats.gguf`` (orkpack/eval/imatrix.py) runs the source's float model (orkpack.model.forward) on a
text, tokenized and chunked as ``orkpack eval`` does (docs/EVAL.md), and records for every matrix
product ``x @ W.T`` (canonical GGUF names, ``blk.3.attn_q.weight``; the output head; each expert of
a stacked ``*_exps`` tensor on its own row) and every input column ``k``:

* ``sum2[k]``: the sum over the tokens that reached it of ``x[:, k]**2`` (float64 while gathered),
* ``absmax[k]``: the largest ``|x[:, k]|``,
* ``count``: those tokens.

``sum2 / count`` is what llama.cpp calls the importance matrix (tools/imatrix/imatrix.cpp gathers the
same sums of squares; tools/quantize/quantize.cpp divides by the count). The file is llama.cpp's GGUF
imatrix format, so ``llama-quantize --imatrix`` reads it and orkpack reads llama.cpp's:

* KV ``general.type = "imatrix"``, ``imatrix.datasets`` (array of strings), ``imatrix.chunk_count``
  and ``imatrix.chunk_size`` (u32);
* per matrix, ``<name>.in_sum2``: F32, ne0 = K, ne1 = matrices (1, or the experts) and
  ``<name>.counts``: F32, ne0 = 1, ne1 = matrices;
* orkpack's own ``<name>.in_absmax``: F32 like ``in_sum2``. llama.cpp's loader keeps only the tensors
  named ``*.in_sum2`` and ``*.counts`` and ignores it; a llama.cpp file has none (``absmax`` is None).

llama.cpp's legacy ``.dat`` files load too (no per-expert counts and no maxima: the sums come flat,
divided back by their call count as llama-quantize does).

This package is the one room of activation statistics: the data (:mod:`.data`) and its files (:mod:`.formats`),
loaded by whoever needs them (the NF4 search, smoothing and clipping in orkpack/transforms/, the eval); it
knows nothing of how they are gathered (orkpack/eval/imatrix.py runs the model and hands them down).
"""
from .data import ActStats, Entry, StatsError
from .formats import load, save

__all__ = ["ActStats", "Entry", "StatsError", "load", "save"]
