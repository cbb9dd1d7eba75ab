"""Models by their Hugging Face hub name (issue 27): ``ORG/NAME``, ``ORG/NAME:FILE.gguf``, ``hf://ORG/NAME``.

Wherever a checkpoint is named (``build``, ``plan``, ``eval``, ``imatrix``, ``verify --source``), :func:`locate`
turns the name into a local path, so every reader below sees a folder or a file as before:

* **A local path that exists always wins.** ``ORG/NAME`` is a hub name only when no file or folder of that name
  exists; ``./ORG/NAME`` (or any path that is not exactly ``ORG/NAME``) is always a path, and ``hf://ORG/NAME``
  always the hub. A name that is neither an existing path nor a valid repo id stays a path (the readers' "no such
  file or folder" line).
* **Only the files a build reads are downloaded** (:func:`download_plan`, from the repo's file listing):
  config.json, generation_config.json, the tokenizer files (:data:`META_FILES`), and the safetensors weights: with
  ``model.safetensors.index.json`` exactly the shards its ``weight_map`` names, else every top-level
  ``*.safetensors`` except Mistral's ``consolidated*.safetensors`` (the same weights under Mistral's own names).
  Nothing in a sub-folder (``original/``, ``onnx/``, ``gguf/``), no ``.bin`` / ``.pt`` / ``.onnx`` / ``.msgpack`` /
  ``.h5``, no GGUF, no images. ``ORG/NAME:FILE.gguf`` downloads that one file.
* **huggingface_hub does the rest**: its cache (``HF_HUB_CACHE``, shared with transformers, llama.cpp ``-hf`` and
  ``hf download``), its resume, its progress bars, xet, ``HF_TOKEN`` and ``HF_ENDPOINT``. It is imported here, and
  only when a hub name is given: a local path never imports it.
* **Offline** (``HF_HUB_OFFLINE=1``, or the hub cannot be reached) the cache alone is used; a model (or a shard of
  it) that is not there is one line saying so and how to get it.

:class:`Origin` is what a pack's ``provenance.hub`` and a tier map's ``model.hub`` record: the repo id, the revision
asked for, the commit it resolved to, and the GGUF file (docs/FORMAT.md section 2).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from ..errors import SourceError, escape_name

HUB_PREFIX = "hf://"
INDEX = "model.safetensors.index.json"
# the files beside the weights that a build, a plan or the eval reads (the config, the model record's tokenizer and
# chat template: orkpack/sources/modelkv.py and gguf-py's SpecialVocab), downloaded when the repo has them
META_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt",
              "added_tokens.json", "chat_template.jinja", "chat_template.json")
# Mistral's own checkpoint format beside the HF shards (other tensor names, the same weights): never downloaded
NOT_HF_WEIGHTS = re.compile(r"consolidated([.-].*)?\.safetensors")

# huggingface_hub's repo id rule (validate_repo_id): [\w.-]{1,96} with a word character at each end, no "--"
# or ".."; orkpack asks for the ORG/NAME form (a bare NAME stays a path, so a typo is not a hub look-up)
_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_REPO = re.compile(rf"{_PART}/{_PART}")
# a name ending like a file orkpack reads or writes is a path someone mistyped, not a repo (hf:// still forces it)
_FILE_SUFFIXES = (".orkpack", ".gguf", ".safetensors", ".json", ".csv", ".toml", ".txt", ".dat")


@dataclass(frozen=True)
class Origin:
    """Where a checkpoint came from on the hub."""
    repo: str
    revision: str  # as asked (a branch, a tag or a commit; "main" by default)
    commit: str  # the commit it resolved to
    file: str | None = None  # the GGUF file of ORG/NAME:FILE

    @property
    def label(self) -> str:
        return self.repo + (f":{self.file}" if self.file else "")

    def recorded(self) -> dict:
        return {"repo": self.repo, "revision": self.revision, "commit": self.commit} \
            | ({"file": self.file} if self.file else {})


@dataclass(frozen=True)
class Located:
    """A checkpoint as a local path, with its hub origin when it came from the hub."""
    path: Path
    origin: Origin | None = None

    @property
    def shown(self) -> str:
        """Its name for people: the hub name, or the path as given."""
        return self.origin.label if self.origin else str(self.path)


@dataclass(frozen=True)
class HubName:
    repo: str
    file: str | None

    @property
    def label(self) -> str:
        return self.repo + (f":{self.file}" if self.file else "")


def _valid_file(f: str) -> bool:
    return (f.lower().endswith(".gguf") and not f.startswith("/") and "\\" not in f
            and all(part not in ("", ".", "..") for part in f.split("/")))


def parse(spec) -> HubName | None:
    """The hub name ``spec`` gives, or None when it is a path (a Path object, an existing file or folder, or no
    valid ``ORG/NAME[:FILE.gguf]``). ``hf://`` forces the hub: SourceError when what follows is not a repo id."""
    if isinstance(spec, (Path, Located)):
        return None
    s = os.fspath(spec)
    forced = s.startswith(HUB_PREFIX)
    if not forced and os.path.lexists(s):
        return None
    body = s[len(HUB_PREFIX):] if forced else s
    repo, sep, file = body.partition(":")
    ok = _REPO.fullmatch(repo) is not None and "--" not in repo and ".." not in repo and (not sep or _valid_file(file))
    if ok and not forced and not sep and repo.lower().endswith(_FILE_SUFFIXES):
        return None
    if not ok:
        if forced:
            raise SourceError(f"{escape_name(s)}: not a hub model name; give hf://ORG/NAME, or hf://ORG/NAME:FILE.gguf "
                              "for one GGUF file of a repo")
        return None
    return HubName(repo, file or None)


def locate(spec, *, revision: str | None = None) -> Located:
    """A checkpoint named by a path or a hub name, as a local path (module docstring). A Located is returned as it
    is. ``revision`` (a branch, tag or commit) applies to a hub name; with a local path it is refused in one line."""
    if isinstance(spec, Located):
        return spec
    name = parse(spec)
    if name is None:
        if revision is not None:
            raise SourceError(f"{escape_name(os.fspath(spec))}: --revision {escape_name(revision, 60)} is a revision "
                              "of a hub model (ORG/NAME, or hf://ORG/NAME), and this is a local path; drop --revision")
        return Located(Path(spec))
    return _fetch(name, revision)


# ------------------------------------------------------------------------------------------ what to download

def read_weight_map(path: Path) -> dict[str, str]:
    """``model.safetensors.index.json``'s weight_map (tensor -> shard), checked: every shard a plain file name."""
    try:
        idx = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise SourceError(f"{escape_name(str(path))}: cannot read the shard index ({e.__class__.__name__}); "
                          "restore it from the model's original files") from None
    wm = idx.get("weight_map") if isinstance(idx, dict) else None
    if not isinstance(wm, dict) or not wm or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise SourceError(f"{escape_name(str(path))}: no usable 'weight_map' (tensor -> shard file); restore the "
                          "original index")
    for shard in sorted(set(wm.values())):
        if Path(shard).name != shard or shard in (".", ".."):
            raise SourceError(f"{escape_name(str(path))}: shard {escape_name(shard)!r} is not a plain file name; "
                              "fix the index")
    return wm


def download_plan(listing, read_index: Callable[[], dict[str, str]], label: str, *,
                  where: str = "the repo", fix: str = "") -> list[str]:
    """The files of a repo (``listing``: its file paths) that make the model, in download order: the
    :data:`META_FILES` it has, then the index and the shards it names (``read_index()`` reads the index), or without
    an index its top-level ``*.safetensors`` (``consolidated*`` excepted). SourceError naming what ``where``
    lacks (``fix``: what to do about a missing shard)."""
    top = {f for f in listing if "/" not in f}
    meta = [f for f in META_FILES if f in top]
    if INDEX in top:
        shards = sorted(set(read_index().values()))
        missing = [s for s in shards if s not in top]
        if missing:
            raise SourceError(f"{escape_name(label)}: its {INDEX} names {escape_name(missing[0])}"
                              f"{f' and {len(missing) - 1} more shards' if len(missing) > 1 else ''}, which "
                              f"{where} does not hold{fix}")
        return meta + [INDEX] + shards
    weights = sorted(f for f in top if f.endswith(".safetensors") and not NOT_HF_WEIGHTS.fullmatch(f))
    if weights:
        return meta + weights
    ggufs = sorted(f for f in listing if f.lower().endswith(".gguf"))
    repo = label.partition(":")[0]
    if ggufs:
        raise SourceError(f"{escape_name(label)}: {where} holds no safetensors weights, only GGUF files: name one, "
                          f"e.g. {escape_name(repo)}:{escape_name(ggufs[0])}")
    raise SourceError(f"{escape_name(label)}: {where} holds no safetensors weights (model.safetensors or shards with "
                      f"{INDEX}) and no GGUF; orkpack builds from those")


def literal_pattern(name: str) -> str:
    """An fnmatch pattern (huggingface_hub's allow_patterns) that matches exactly the file ``name``."""
    return re.sub(r"([*?\[])", r"[\1]", name)


# ------------------------------------------------------------------------------------------ huggingface_hub

def _hub():
    try:
        import huggingface_hub
        import huggingface_hub.constants  # noqa: F401 - a submodule huggingface_hub's lazy __init__ does not load
    except ImportError:
        raise SourceError("a hub model name needs huggingface_hub: pip install huggingface_hub") from None
    return huggingface_hub


def _is_network(e: BaseException) -> bool:
    """A connection that failed (no network, DNS, refused, timed out; offline mode), not an answer of the hub."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if isinstance(e, OfflineModeIsEnabled):
        return True
    if isinstance(e, HfHubHTTPError):
        return False
    # requests' errors are OSErrors; httpx's (huggingface_hub 1.x, httpx2 in 2.x) are its TransportError family
    return isinstance(e, (OSError, TimeoutError)) or any(
        c.__name__ in ("TransportError", "TimeoutException", "NetworkError") and c.__module__.split(".")[0].startswith("httpx")
        for c in type(e).__mro__)


def _is_network_errno(e: OSError) -> bool:
    import errno

    return e.errno in (errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EHOSTUNREACH,
                       errno.ENETUNREACH, errno.ENETDOWN, errno.EPIPE)


def _hub_refused(e: BaseException, name: HubName, revision: str | None) -> SourceError | None:
    """The one line for an answer of the hub that no cache can make good (no such repo or revision, gated), or None."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    label = escape_name(name.label)
    if isinstance(e, GatedRepoError):
        return SourceError(f"{label}: the repo is gated; accept its terms on huggingface.co/{escape_name(name.repo)} "
                           "and set HF_TOKEN (or run `hf auth login`)")
    if isinstance(e, RepositoryNotFoundError):
        return SourceError(f"{label}: no such file or folder, and no model {escape_name(name.repo)} on the Hugging Face "
                           "hub (a private repo needs HF_TOKEN); check the name")
    if isinstance(e, RevisionNotFoundError):
        return SourceError(f"{label}: no revision {escape_name(str(revision), 60)} on the hub; give a branch, tag or "
                           "commit of the repo")
    return None


def _get_command(name: HubName, revision: str | None) -> str:
    rev = f" --revision {revision}" if revision else ""
    return f"hf download {name.repo}{f' {name.file}' if name.file else ''}{rev}"


def _fetch(name: HubName, revision: str | None) -> Located:
    hh = _hub()
    asked = revision or hh.constants.DEFAULT_REVISION
    try:
        info = hh.HfApi().model_info(name.repo, revision=revision)
    except Exception as e:  # noqa: BLE001 - sorted below: the hub's refusals, the network's, or re-raised
        refused = _hub_refused(e, name, revision)
        if refused is not None:
            raise refused from None
        from huggingface_hub.errors import HfHubHTTPError

        if not (_is_network(e) or isinstance(e, HfHubHTTPError)):
            raise
        why = ("offline (HF_HUB_OFFLINE=1)" if hh.constants.HF_HUB_OFFLINE else
               f"the hub cannot be reached ({e.__class__.__name__})")
        return _from_cache(hh, name, revision, asked, why)
    listing = [s.rfilename for s in info.siblings or []]
    try:
        if name.file is not None:
            if name.file not in listing:
                raise _lacks_file(name, listing, "the repo")
            path = Path(hh.hf_hub_download(name.repo, name.file, revision=revision))
            return Located(path, Origin(name.repo, asked, _commit_of(path, name.file), name.file))
        files = download_plan(listing, lambda: read_weight_map(
            hh.hf_hub_download(name.repo, INDEX, revision=revision)), name.label)
        folder = Path(hh.snapshot_download(name.repo, revision=revision,
                                           allow_patterns=[literal_pattern(f) for f in files]))
    except Exception as e:  # noqa: BLE001 - a download cut off: one line (huggingface_hub resumes it next time)
        refused = _hub_refused(e, name, revision)
        if refused is not None:
            raise refused from None
        from huggingface_hub.errors import HfHubHTTPError

        if isinstance(e, HfHubHTTPError):  # the hub answered with an error mid-download (5xx, 403, ...)
            said = str(e).splitlines()[0] if str(e) else e.__class__.__name__
            raise SourceError(f"{escape_name(name.label)}: the download failed ({escape_name(said, 120)}); run the "
                              "command again: it resumes where it stopped") from None
        if isinstance(e, OSError) and getattr(e, "errno", None) is not None and not _is_network_errno(e):
            raise SourceError(f"{escape_name(name.label)}: cannot write the Hugging Face cache "
                              f"{escape_name(str(hh.constants.HF_HUB_CACHE))} ({e.strerror}); free space there or "
                              "set HF_HUB_CACHE to another folder") from None
        if not _is_network(e):
            raise
        raise SourceError(f"{escape_name(name.label)}: the download stopped ({e.__class__.__name__}); run the "
                          "command again: it resumes where it stopped") from None
    return Located(folder, Origin(name.repo, asked, folder.name))


def _lacks_file(name: HubName, listing, where: str) -> SourceError:
    ggufs = sorted(f for f in listing if f.lower().endswith(".gguf"))
    some = ", ".join(escape_name(g) for g in ggufs[:4]) + (", ..." if len(ggufs) > 4 else "")
    return SourceError(f"{escape_name(name.label)}: {where} has no file {escape_name(name.file)}; "
                       + (f"its GGUF files: {some}" if ggufs else "it holds no GGUF file"))


def _commit_of(path: Path, file: str) -> str:
    """The commit of a file huggingface_hub returned: its snapshot folder's name (snapshots/<commit>/<file>)."""
    return path.parents[len(PurePosixPath(file).parts) - 1].name


def _from_cache(hh, name: HubName, revision: str | None, asked: str, why: str) -> Located:
    """The model from huggingface_hub's cache alone (offline, or the hub unreachable)."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    label = escape_name(name.label)
    absent = (f"{label}: no such file or folder, and not in the Hugging Face cache ({escape_name(str(hh.constants.HF_HUB_CACHE))}"
              f"{f', revision {escape_name(asked, 60)}' if revision else ''}) while {why}; download it with network "
              f"access (this command does, or `{escape_name(_get_command(name, revision))}`)")
    try:
        if name.file is not None:
            path = Path(hh.hf_hub_download(name.repo, name.file, revision=revision, local_files_only=True))
            return Located(path, Origin(name.repo, asked, _commit_of(path, name.file), name.file))
        # the snapshot folder of the revision (refs/<revision> -> snapshots/<commit>); the pattern keeps
        # huggingface_hub >= 2's completeness check to a file every model has, the plan below checks the rest
        folder = Path(hh.snapshot_download(name.repo, revision=revision, local_files_only=True,
                                           allow_patterns=["config.json"]))
    except LocalEntryNotFoundError:
        raise SourceError(absent) from None
    listing = _cached_listing(hh, name, revision, folder)

    def index():
        if not (folder / INDEX).is_file():
            raise SourceError(f"{label}: {INDEX} is not in the Hugging Face cache while {why}; download the model "
                              f"with network access (this command does, or `{escape_name(_get_command(name, revision))}`)")
        return read_weight_map(folder / INDEX)

    files = download_plan(listing, index, name.label, where="the Hugging Face cache",
                          fix=f" while {why}; download it with network access (this command does, or "
                              f"`{escape_name(_get_command(name, revision))}`)")
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise SourceError(f"{label}: {escape_name(missing[0])}{f' and {len(missing) - 1} more files' if len(missing) > 1 else ''} "
                          f"not in the Hugging Face cache while {why}; finish the download with network access (this "
                          f"command does, or `{escape_name(_get_command(name, revision))}`)")
    return Located(folder, Origin(name.repo, asked, folder.name))


def _cached_listing(hh, name: HubName, revision: str | None, folder: Path) -> list[str]:
    """The repo's files at the cached commit: huggingface_hub's cached tree listing (>= 2.0, written by a
    download), else the files the snapshot folder holds."""
    tree = getattr(hh, "get_cached_repo_tree", None)
    if tree is not None:
        from huggingface_hub import errors

        try:
            return [f.path for f in tree(name.repo, revision=folder.name)]
        except getattr(errors, "CachedRepoTreeNotFoundError", LookupError):
            pass
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
