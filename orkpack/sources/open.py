"""``open_source``: one entry point for every checkpoint form.

* a folder (HF): ``model.safetensors.index.json`` -> the shards its ``weight_map``
  names; else every ``*.safetensors`` in it, sorted by name. ``config.json``
  beside them gives the architecture (without it, it is guessed from the names).
* a ``.safetensors`` file (a ``config.json`` in the same folder is used if present).
* a ``.gguf`` file.
* a hub name (``ORG/NAME``, ``ORG/NAME:FILE.gguf``, ``hf://ORG/NAME``) that is not a local path: downloaded into,
  or found in, huggingface_hub's cache (orkpack/sources/hub.py), then one of the above.

Every user mistake raises :class:`SourceError` with one line naming the path.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import SourceError, escape_name
from .config import FACT_KEYS, facts_from_hf_config, load_hf_config
from .hub import INDEX, Located, locate, read_weight_map
from .safetensors import SafetensorsSource


def _n(p: Path) -> str:
    return escape_name(str(p))


def _read_index(folder: Path) -> tuple[list[Path], dict[str, str]]:
    path = folder / INDEX
    wm = read_weight_map(path)
    files = []
    for shard in sorted(set(wm.values())):
        p = folder / shard
        if not p.is_file():
            raise SourceError(f"{_n(path)}: names shard {escape_name(shard)} which is missing from {_n(folder)}; "
                              "download it")
        files.append(p)
    return files, wm


def _config(path: Path) -> dict:
    return load_hf_config(path)


def open_source(path: Path | str | Located, *, on_warning: Callable[[str], None] | None = None):
    """Open a checkpoint (folder, .safetensors or .gguf; a hub name or a :class:`~.hub.Located`) as a Source.

    ``on_warning`` receives the one-per-source message about dequantizing a
    quantized GGUF; without it the message goes to ``warnings.warn``
    (``LossyDequantWarning``).
    """
    p = locate(path).path
    if not p.exists():
        raise SourceError(f"{_n(p)}: no such file or folder; check the path")
    if p.is_dir():
        try:
            names = sorted(q.name for q in p.iterdir())
        except OSError as e:
            raise SourceError(f"{_n(p)}: cannot list the folder ({e.strerror}); check its permissions") from None
        config = _config(p / "config.json") if "config.json" in names else None
        if INDEX in names:
            files, wm = _read_index(p)
            return SafetensorsSource(p, files, config, expected=wm)
        files = [p / n for n in names if n.endswith(".safetensors") and (p / n).is_file()]
        if files:
            return SafetensorsSource(p, files, config)
        ggufs = [n for n in names if n.endswith(".gguf")]
        hint = f"; to build from the GGUF, pass the file: {_n(p / ggufs[0])}" if ggufs else \
            "; expected config.json with model.safetensors or sharded *.safetensors"
        raise SourceError(f"{_n(p)}: folder holds no safetensors weights{hint}")
    if not p.is_file():
        raise SourceError(f"{_n(p)}: not a regular file or folder; pass a model folder, .safetensors or .gguf")
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise SourceError(f"{_n(p)}: cannot read ({e.strerror}); check its permissions") from None
    if p.suffix == ".gguf" or magic == b"GGUF":
        from .gguf import GGUFSource  # here: gguf-py (reader, writer, yaml) costs a safetensors build's start-up ~0.05 s

        return GGUFSource(p, on_warning=on_warning)
    if p.suffix == ".safetensors":
        cfg_path = p.parent / "config.json"
        config = _config(cfg_path) if cfg_path.is_file() else None
        return SafetensorsSource(p, [p], config)
    raise SourceError(f"{_n(p)}: unknown checkpoint type; pass a model folder, a .safetensors or a .gguf file")


def model_facts(source_or_config: Any) -> dict:
    """Facts (``archs.FACT_KEYS``) from a Source, an HF config dict, a config.json path, a model folder or a .gguf.

    A folder is read through its config.json alone. SourceError when the
    architecture is unknown (``orkpack.archs.generic_facts`` plans those).
    """
    obj = source_or_config
    if isinstance(obj, (str, Path, Located)):
        p = locate(obj).path
        if p.is_dir() or p.name == "config.json":
            cfg_path = p / "config.json" if p.is_dir() else p
            return facts_from_hf_config(load_hf_config(cfg_path), escape_name(str(cfg_path)))
        src = open_source(p)
        try:
            return model_facts(src)
        finally:
            src.close()
    if isinstance(obj, Mapping):
        if set(FACT_KEYS) <= set(obj):
            return {k: obj[k] for k in FACT_KEYS}
        return facts_from_hf_config(obj)
    cfg = getattr(obj, "config", None)
    root = escape_name(str(getattr(obj, "root", "source")))
    if getattr(obj, "kind", None) == "gguf":
        if cfg is None and getattr(obj, "facts_error", None) is not None:
            raise obj.facts_error
        if cfg is None:
            raise SourceError(f"{root}: GGUF architecture {escape_name(repr(getattr(obj, 'arch', None)), 40)} "
                              "is not a known family")
        return {k: cfg[k] for k in FACT_KEYS}
    if cfg is None:
        raise SourceError(f"{root}: no config.json next to the weights; put the model's config.json beside them "
                          "(orkpack build --no-plan places by rules without one)")
    return facts_from_hf_config(cfg, root)
