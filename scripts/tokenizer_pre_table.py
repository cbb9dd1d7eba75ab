"""Write orkpack/data/tokenizer_pre.json: llama.cpp's converter's table of BPE pre-tokenizer names by hash.

    python scripts/tokenizer_pre_table.py LLAMA_CPP_SOURCE REVISION [OUT.json]

llama.cpp's ``convert_hf_to_gguf.py`` (``conversion/base.py``, ``get_vocab_base_pre``) names an HF tokenizer's
pre-tokenizer (``tokenizer.ggml.pre``) by the sha256 of ``str()`` of the ids its tokenizer gives a check text; this
copies that check text and every (hash, name) pair of the given source tree (MIT, llama.cpp's authors), so the
HF reader (orkpack/sources/modelkv.py) names it the same way without the converter. Re-run it when the llama.cpp
the project pins changes; tests/test_model_record.py checks the copy against the pinned source when it is there.
"""
from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "orkpack" / "data" / "tokenizer_pre.json"


def table(src_tree: Path, rev: str) -> dict:
    base = src_tree / "conversion" / "base.py"
    if not base.is_file():  # an older tree: the converter in one file
        base = src_tree / "convert_hf_to_gguf.py"
    text = base.read_text(encoding="utf-8")
    body = text[text.index("def get_vocab_base_pre"):]
    body = body[:body.index("\n    def ", 1)]
    chktxt = ast.literal_eval(re.search(r"chktxt = ('.*')\n", body).group(1))
    pairs = re.findall(r'if chkhsh == "([0-9a-f]{64})":\n(?:\s+#.*\n)*\s+res = "([^"]+)"', body)
    if len(pairs) != body.count("if chkhsh =="):
        raise SystemExit(f"{base}: read {len(pairs)} of {body.count('if chkhsh ==')} hashes; the layout changed")
    names: dict[str, str] = {}
    for h, name in pairs:
        names.setdefault(h, name)  # the converter's first match wins (later ifs of one hash repeat it)
    return {"source": f"llama.cpp {rev} {base.relative_to(src_tree)} get_vocab_base_pre (MIT)",
            "chktxt": chktxt, "names": names}


if __name__ == "__main__":
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else OUT
    out.write_text(json.dumps(table(Path(sys.argv[1]), sys.argv[2]), indent=1, ensure_ascii=False, sort_keys=False) + "\n",
                   encoding="utf-8")
    print(f"wrote {out}")
