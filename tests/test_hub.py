"""Models by their hub name (issue 27): ``orkpack build|plan|eval ORG/NAME`` and ``ORG/NAME:FILE.gguf``, offline.

A Hugging Face cache is laid out here exactly as huggingface_hub lays it out (``models--ORG--NAME/blobs``,
``snapshots/<commit>/...`` symlinked to the blobs, ``refs/<branch>``, and huggingface_hub 2's tree listing
``trees/<commit>.json``), and huggingface_hub's own readers (``scan_cache_dir``, ``try_to_load_from_cache``,
``snapshot_download(local_files_only=True)``) are asked to find it before anything else runs. Every command runs
with ``HF_HUB_OFFLINE=1`` (or a hub that refuses connections), so nothing here touches the network.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orkpack.errors import SourceError
from orkpack.pack.reader import Pack
from orkpack.sources import hub
from orkpack.synth import write_gguf_model, write_hf_model, write_tokenizer

ROOT = Path(__file__).resolve().parents[1]
REPO, GGUF_REPO, PARTIAL = "orkpack-test/tiny-llama", "orkpack-test/tiny-llama-GGUF", "orkpack-test/partial"
C1, C2, G1, P1 = "1" * 40, "2" * 40, "a1" * 20, "b2" * 20
SMALL = dict(layers=2, hidden=128, intermediate=256, heads=4, kv_heads=2, vocab=512)


def _cache_repo(cache: Path, repo: str, commit: str, files: dict[str, bytes], refs=("main",),
                listing: dict[str, int] | None = None) -> Path:
    """One commit of a model repo in huggingface_hub's cache layout: each file a blob named by its hash, the
    snapshot's entries relative symlinks to them, ``refs/<ref>`` the commit; ``listing`` (path -> size): the
    repo's whole file list as huggingface_hub 2 caches it (trees/<commit>.json), files not downloaded included."""
    store = cache / ("models--" + repo.replace("/", "--"))
    snap = store / "snapshots" / commit
    for rel, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        blob = store / "blobs" / digest
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(data)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (store / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (store / "refs" / ref).write_text(commit)
    if listing is not None:
        tree = pytest.importorskip("huggingface_hub._tree_cache")
        tree.write_tree_cache(str(store), commit, {
            p: tree.TreeCacheEntry(size=n, blob_id=hashlib.sha1(p.encode()).hexdigest()) for p, n in listing.items()})
    return snap


def _folder_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def hubcache(tmp_path_factory):
    """The cache: REPO at C1 (main; the synth model, its tokenizer and decoys) and C2 (tag v2, another seed);
    GGUF_REPO (two GGUFs); PARTIAL (an index whose second shard was never downloaded)."""
    base = tmp_path_factory.mktemp("hub")
    cache = base / "cache"
    m1 = write_hf_model(base / "m1", seed=11, **SMALL)
    write_tokenizer(m1, n_merges=200)
    decoys = {"pytorch_model.bin": b"\x80\x02 not a pickle anyone should load", "onnx/model.onnx": b"onnx decoy",
              "tiny-llama-Q8_0.gguf": b"GGUF decoy", "README.md": b"# tiny\n"}
    files1 = _folder_files(m1) | decoys
    # the repo also holds files no one downloaded: huggingface_hub 2's completeness check must not ask for them
    listing = {p: len(d) for p, d in files1.items()} | {"flax_model.msgpack": 10, "original/consolidated.00.pth": 10,
                                                        "original/params.json": 2}
    snap1 = _cache_repo(cache, REPO, C1, files1, listing=listing)
    m2 = write_hf_model(base / "m2", seed=12, **SMALL)
    snap2 = _cache_repo(cache, REPO, C2, _folder_files(m2), refs=("v2",))
    g_f16 = write_gguf_model(base / "tiny-F16.gguf", seed=11, **SMALL)
    g_q8 = write_gguf_model(base / "tiny-Q8_0.gguf", seed=11, tensor_type="Q8_0", **SMALL)
    gsnap = _cache_repo(cache, GGUF_REPO, G1, {"tiny-F16.gguf": g_f16.read_bytes(), "tiny-Q8_0.gguf": g_q8.read_bytes(),
                                               "README.md": b"# gguf\n"})
    partial = _folder_files(m1)
    partial.pop(sorted(f for f in partial if f.endswith(".safetensors"))[-1])
    _cache_repo(cache, PARTIAL, P1, partial)
    return {"cache": cache, "snap1": snap1, "snap2": snap2, "gsnap": gsnap, "base": base}


def _env(hubcache, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_CACHE=str(hubcache["cache"]),
               HF_HOME=str(hubcache["base"] / "hf-home"), HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def _cli(hubcache, *args, cwd=None, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orkpack", *map(str, args)], capture_output=True, text=True,
                          env=_env(hubcache, **env), cwd=cwd, timeout=600)


def _one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


# ------------------------------------------------------------------------------------------- the cache itself

def test_the_cache_is_huggingface_hubs_own(hubcache):
    """huggingface_hub reads the cache built here as one of its own: every repo and revision, no warning, and
    the snapshot folders and files where its lookups put them."""
    hh = pytest.importorskip("huggingface_hub")
    cache = hubcache["cache"]
    info = hh.scan_cache_dir(cache)
    assert info.warnings == []
    revs = {(r.repo_id, rev.commit_hash) for r in info.repos for rev in r.revisions}
    assert revs == {(REPO, C1), (REPO, C2), (GGUF_REPO, G1), (PARTIAL, P1)}
    assert hh.try_to_load_from_cache(REPO, "config.json", cache_dir=cache) == str(hubcache["snap1"] / "config.json")
    assert hh.try_to_load_from_cache(REPO, "config.json", cache_dir=cache, revision="v2") == \
        str(hubcache["snap2"] / "config.json")
    got = hh.snapshot_download(REPO, cache_dir=cache, local_files_only=True, allow_patterns=["config.json"])
    assert Path(got) == hubcache["snap1"]
    assert Path(hh.hf_hub_download(GGUF_REPO, "tiny-F16.gguf", cache_dir=cache, local_files_only=True)) == \
        hubcache["gsnap"] / "tiny-F16.gguf"


# ------------------------------------------------------------------------------------------- plan, build, eval

def _plan_json(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_plan_by_hub_name_is_the_plan_of_its_snapshot(hubcache):
    """`orkpack plan ORG/NAME` offline plans the cached snapshot: the same tier map as the snapshot folder's, named by
    the repo and recording the commit."""
    by_name = _plan_json(_cli(hubcache, "plan", REPO, "--json"))
    direct = _plan_json(_cli(hubcache, "plan", hubcache["snap1"], "--json"))
    assert by_name["model"]["source"] == REPO
    assert by_name["model"]["hub"] == {"repo": REPO, "revision": "main", "commit": C1}
    assert direct["model"]["source"] == C1 and "hub" not in direct["model"]  # the folder's own name: the commit
    for d in (by_name, direct):
        d["model"].pop("source")
        d["model"].pop("hub", None)
    assert by_name == direct


def test_revision_picks_another_commit(hubcache):
    """--revision: a tag in refs/ or a commit hash; each plans that commit's model (another seed: other shapes are
    not needed, the recorded commit says which)."""
    for rev in ("v2", C2):
        d = _plan_json(_cli(hubcache, "plan", REPO, "--revision", rev, "--json"))
        assert d["model"]["hub"] == {"repo": REPO, "revision": rev, "commit": C2}
    line = _one_line_error(_cli(hubcache, "plan", REPO, "--revision", "v9"))
    assert "not in the Hugging Face cache" in line and "--revision v9" in line


def test_a_cluster_plan_records_the_hub_origin(hubcache):
    """`orkpack plan ORG/NAME --boards ...`: the cluster plan and each node's tier map name the repo and its commit."""
    d = _plan_json(_cli(hubcache, "plan", REPO, "--boards", "rk3588-16g,rk3588-16g", "--ctx", "256", "--json"))
    want = {"repo": REPO, "revision": "main", "commit": C1}
    assert d["model"]["source"] == REPO and d["model"]["hub"] == want
    from orkpack.tiers.cluster import node_tiermap, plan_cluster

    plan, _, _ = plan_cluster(hub.Located(hubcache["snap1"], hub.Origin(REPO, "main", C1)), "rk3588-16g,rk3588-16g",
                              ctx=256, baseline=False)
    used = [j for j, n in enumerate(plan.nodes) if n["used"]]
    assert used and all(node_tiermap(plan, j).model["hub"] == want for j in used)


def _normalized(path: Path) -> tuple[dict, bytes]:
    with Pack.open(path) as p:
        h = json.loads(json.dumps(p.header))
        data = bytes(p.data_view())
    hubrec = h["provenance"].pop("hub", None)
    h["tiermap"]["model"].pop("source")
    h["tiermap"]["model"].pop("hub", None)
    return h | {"_hub": hubrec}, data


@pytest.fixture(scope="module")
def built(hubcache):
    """REPO built by name offline, and its snapshot folder built directly."""
    out = hubcache["base"] / "out"
    out.mkdir()
    r = _cli(hubcache, "build", REPO, "-o", out / "by-name.orkpack", "--threads", "1", "--json")
    assert r.returncode == 0, r.stderr
    r2 = _cli(hubcache, "build", hubcache["snap1"], "-o", out / "direct.orkpack", "--threads", "1", "--json")
    assert r2.returncode == 0, r2.stderr
    return out / "by-name.orkpack", out / "direct.orkpack"


def test_build_by_hub_name_is_the_build_of_its_snapshot(built):
    """The same tensor bytes and the same header as building the snapshot folder, but for where it came from:
    provenance.hub (repo, revision, commit) and the embedded tier map's model name."""
    (h1, d1), (h2, d2) = _normalized(built[0]), _normalized(built[1])
    assert d1 == d2
    assert h1.pop("_hub") == {"repo": REPO, "revision": "main", "commit": C1} and h2.pop("_hub") is None
    assert h1 == h2
    names = [s["file"] for s in h1["provenance"]["sources"]]
    assert names == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_inspect_shows_the_hub_origin(hubcache, built):
    r = _cli(hubcache, "inspect", built[0], "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["provenance"]["hub"] == {"repo": REPO, "revision": "main", "commit": C1}
    r = _cli(hubcache, "inspect", built[0])
    assert r.returncode == 0 and f"{REPO} @ {C1[:12]}" in r.stdout, r.stdout


def test_eval_by_hub_name(hubcache, built):
    """`orkpack eval ORG/NAME PACK`: the cached model is the float reference, named by the repo in the report, and
    every number is the one of the eval against the snapshot folder."""
    r = _cli(hubcache, "eval", REPO, built[0], "--json", "--ctx", "64", "--chunks", "1")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    r = _cli(hubcache, "eval", hubcache["snap1"], built[0], "--json", "--ctx", "64", "--chunks", "1")
    assert r.returncode == 0, r.stderr
    direct = json.loads(r.stdout)
    assert d.pop("source") == REPO and d.pop("source_hub") == {"repo": REPO, "revision": "main", "commit": C1}
    assert direct.pop("source") == str(hubcache["snap1"]) and "source_hub" not in direct
    assert [p["path"] for p in d["paths"]] == ["reference", "prefill", "decode"] and d["scored"] > 0
    assert d == direct


def test_imatrix_and_verify_source_by_hub_name(hubcache, built):
    """`orkpack imatrix ORG/NAME` gathers the same statistics as from the snapshot folder; `verify --source ORG/NAME`
    locates the model the same way (and a missing one is its one line, exit 2)."""
    out = hubcache["base"] / "out"
    for name, src in (("by-name", REPO), ("direct", hubcache["snap1"])):
        r = _cli(hubcache, "imatrix", src, "-o", out / f"{name}.imatrix.gguf", "--ctx", "64", "--chunks", "1", "--json")
        assert r.returncode == 0, r.stderr
    assert (out / "by-name.imatrix.gguf").read_bytes() == (out / "direct.imatrix.gguf").read_bytes()
    rot = out / "rotated.orkpack"  # verify --source checks a rotated pack's tensors against the source it names
    r = _cli(hubcache, "build", REPO, "-o", rot, "--no-plan", "--npu", "*", "--rotate", "--threads", "1")
    assert r.returncode == 0, r.stderr
    r = _cli(hubcache, "verify", rot, "--device", "host", "--reference", "--source", REPO, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    r = _cli(hubcache, "verify", rot, "--device", "host", "--reference", "--source", REPO, "--revision", "v2", "--json")
    assert r.returncode == 1 and "rotation" in r.stdout, r.stdout + r.stderr  # another commit: other weights
    r = _cli(hubcache, "verify", built[0], "--device", "host", "--reference", "--source", "nobody/nothing")
    assert r.returncode == 2 and "nobody/nothing: no such file or folder, and not in the Hugging Face cache" in \
        r.stdout + r.stderr


def test_one_gguf_file_of_a_gguf_repo(hubcache):
    """ORG/NAME:FILE.gguf takes that file (not the repo's other GGUF); its pack records the file and the commit."""
    d = _plan_json(_cli(hubcache, "plan", f"{GGUF_REPO}:tiny-Q8_0.gguf", "--json"))
    assert d["model"]["source"] == f"{GGUF_REPO}:tiny-Q8_0.gguf" and d["model"]["origin"] == "gguf"
    assert d["model"]["hub"] == {"repo": GGUF_REPO, "revision": "main", "commit": G1, "file": "tiny-Q8_0.gguf"}
    out = hubcache["base"] / "gguf.orkpack"
    r = _cli(hubcache, "build", f"{GGUF_REPO}:tiny-F16.gguf", "-o", out, "--threads", "1", "--no-plan")
    assert r.returncode == 0, r.stderr
    with Pack.open(out) as p:
        prov = p.header["provenance"]
    assert prov["source_format"] == "gguf" and [s["file"] for s in prov["sources"]] == ["tiny-F16.gguf"]
    assert prov["hub"] == {"repo": GGUF_REPO, "revision": "main", "commit": G1, "file": "tiny-F16.gguf"}


def test_eval_of_a_hub_gguf_against_a_hub_source(hubcache):
    """`orkpack eval ORG/NAME ORG/NAME-GGUF:FILE.gguf`, llama.cpp's quantization of the same model, both by name."""
    ids = hubcache["base"] / "ids.txt"  # the synth GGUF carries no tokenizer: token ids instead of a text
    ids.write_text(" ".join(str((7 * i) % 512) for i in range(130)))
    r = _cli(hubcache, "eval", REPO, f"{GGUF_REPO}:tiny-Q8_0.gguf", "--tokens", ids, "--json", "--ctx", "64")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["kind"] == "gguf" and d["pack"] == f"{GGUF_REPO}:tiny-Q8_0.gguf" and d["source"] == REPO
    assert d["pack_hub"] == {"repo": GGUF_REPO, "revision": "main", "commit": G1, "file": "tiny-Q8_0.gguf"}


def test_what_a_repo_lacks_is_one_line(hubcache):
    line = _one_line_error(_cli(hubcache, "plan", GGUF_REPO))
    assert "holds no safetensors weights, only GGUF files" in line and f"{GGUF_REPO}:tiny-F16.gguf" in line
    line = _one_line_error(_cli(hubcache, "plan", f"{GGUF_REPO}:tiny-Q4_K_M.gguf"))
    assert "not in the Hugging Face cache" in line and f"hf download {GGUF_REPO} tiny-Q4_K_M.gguf" in line
    line = _one_line_error(_cli(hubcache, "build", PARTIAL, "-o", hubcache["base"] / "partial.orkpack"))
    assert "names model-00002-of-00002.safetensors, which the Hugging Face cache does not hold while offline" in line
    assert f"hf download {PARTIAL}`" in line
    assert not (hubcache["base"] / "partial.orkpack").exists()


def test_a_model_not_in_the_cache_is_one_line(hubcache):
    line = _one_line_error(_cli(hubcache, "plan", "nobody/nothing"))
    assert "nobody/nothing: no such file or folder, and not in the Hugging Face cache" in line
    assert "HF_HUB_OFFLINE=1" in line and "hf download nobody/nothing" in line
    out = hubcache["base"] / "never.orkpack"
    _one_line_error(_cli(hubcache, "build", "nobody/nothing", "-o", out))
    assert not out.exists()


def test_an_unreachable_hub_falls_back_to_the_cache(hubcache):
    """No HF_HUB_OFFLINE, but the hub refuses the connection: the cache serves what it holds, and what it does not
    hold is one line saying the hub cannot be reached."""
    kw = dict(HF_HUB_OFFLINE=None, HF_ENDPOINT="http://127.0.0.1:9")
    d = _plan_json(_cli(hubcache, "plan", REPO, "--json", **kw))
    assert d["model"]["hub"]["commit"] == C1
    line = _one_line_error(_cli(hubcache, "plan", "nobody/nothing", **kw))
    assert "the hub cannot be reached" in line


def test_a_local_path_always_wins(hubcache, tmp_path):
    """A folder ORG/NAME in the working folder shadows the hub model of that name; hf://ORG/NAME forces the hub;
    ./ORG/NAME and names that are no repo id stay paths (today's line)."""
    local = write_hf_model(tmp_path / REPO, seed=21, **SMALL)
    d = _plan_json(_cli(hubcache, "plan", REPO, "--json", cwd=tmp_path))
    assert "hub" not in d["model"] and d["model"]["source"] == local.name
    d = _plan_json(_cli(hubcache, "plan", f"hf://{REPO}", "--json", cwd=tmp_path))
    assert d["model"]["hub"]["commit"] == C1
    for name in ("./orkpack-test/absent", "no/such/thing", "orkpack-test/model.gguf"):
        line = _one_line_error(_cli(hubcache, "plan", name, cwd=tmp_path))
        assert "no such file or folder" in line and "cache" not in line, line
    line = _one_line_error(_cli(hubcache, "plan", REPO, "--revision", "v2", cwd=tmp_path))
    assert "is a local path; drop --revision" in line
    line = _one_line_error(_cli(hubcache, "plan", "hf://not a repo"))
    assert "not a hub model name" in line


# ------------------------------------------------------------------------------------------- units

LLAMA_LISTING = [  # meta-llama/Llama-3.1-8B-Instruct's files, with the decoys other repos carry added
    ".gitattributes", "LICENSE", "README.md", "USE_POLICY.md", "config.json", "generation_config.json",
    "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors",
    "model-00004-of-00004.safetensors", "model.safetensors.index.json", "original/consolidated.00.pth",
    "original/params.json", "original/tokenizer.model", "special_tokens_map.json", "tokenizer.json",
    "tokenizer_config.json", "pytorch_model.bin", "pytorch_model.bin.index.json", "onnx/model.onnx",
    "onnx/model.onnx_data", "onnx/model_q4.onnx", "flax_model.msgpack", "tf_model.h5", "model.safetensors",
    "consolidated.safetensors", "original/model.safetensors", "gguf/model-Q4_K_M.gguf", "assets/logo.png",
    "model-00005-of-00004.safetensors",  # a stray shard the index does not name
]
SHARDS = [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]


def test_download_plan_takes_only_what_the_index_names():
    """With an index: the config, generation config and tokenizer files at the top, the index and exactly the
    shards it names; never original/ (Meta's .pth and its tokenizer.model), onnx/, .bin, .msgpack, .h5, GGUFs,
    images, Mistral's consolidated.safetensors, a stray top-level model.safetensors or a shard the index omits."""
    wm = {f"model.layers.{i}.mlp.up_proj.weight": s for i, s in enumerate(SHARDS * 2)}
    got = hub.download_plan(LLAMA_LISTING, lambda: wm, "meta-llama/Llama-3.1-8B-Instruct")
    assert got == ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "model.safetensors.index.json"] + SHARDS


def test_download_plan_without_an_index():
    listing = ["config.json", "model.safetensors", "consolidated.safetensors", "params.json", "tokenizer.model",
               "tekken.json", "original/model.safetensors", "vocab.json", "merges.txt", "pytorch_model.bin"]
    assert hub.download_plan(listing, lambda: pytest.fail("no index to read"), "o/n") == \
        ["config.json", "tokenizer.model", "vocab.json", "merges.txt", "model.safetensors"]


def test_download_plan_names_what_a_repo_lacks():
    with pytest.raises(SourceError, match=r"o/n: its model.safetensors.index.json names model-2.safetensors, which "
                                          r"the repo does not hold"):
        hub.download_plan(["config.json", hub.INDEX, "model-1.safetensors"],
                          lambda: {"a": "model-1.safetensors", "b": "model-2.safetensors"}, "o/n")
    with pytest.raises(SourceError, match=r"only GGUF files: name one, e\.g\. o/n:m-Q4_K_M\.gguf"):
        hub.download_plan(["README.md", "m-Q4_K_M.gguf", "m-Q8_0.gguf"], dict, "o/n")
    with pytest.raises(SourceError, match="no safetensors weights"):
        hub.download_plan(["config.json", "pytorch_model.bin", "original/model.safetensors"], dict, "o/n")


def test_allow_patterns_match_exactly_their_file():
    """The download's allow_patterns go through huggingface_hub's own filter: each matches its file and only it,
    even with fnmatch's special characters in the name."""
    filt = pytest.importorskip("huggingface_hub.utils").filter_repo_objects
    names = ["model-[1].safetensors", "model-1.safetensors", "a*b.json", "axb.json", "q?.txt", "qq.txt"]
    for n in names:
        assert list(filt(names, allow_patterns=[hub.literal_pattern(n)])) == [n]


@pytest.mark.parametrize("spec,want", [
    ("HuggingFaceTB/SmolLM2-135M-Instruct", ("HuggingFaceTB/SmolLM2-135M-Instruct", None)),
    ("bartowski/SmolLM2-135M-Instruct-GGUF:SmolLM2-135M-Instruct-Q4_K_M.gguf",
     ("bartowski/SmolLM2-135M-Instruct-GGUF", "SmolLM2-135M-Instruct-Q4_K_M.gguf")),
    ("o/n:sub/x.gguf", ("o/n", "sub/x.gguf")),
    ("hf://o/n", ("o/n", None)),
    ("hf://o/n.gguf", ("o/n.gguf", None)),
    ("./o/n", None), ("/o/n", None), ("o/n/m", None), ("n", None), ("o--x/n", None), ("o/n..x", None),
    ("o/n:x.safetensors", None), ("o/n:../x.gguf", None), ("o/n.orkpack", None), ("o/-n", None), ("~/n", None),
])
def test_parse(spec, want, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = hub.parse(spec)
    assert (None if got is None else (got.repo, got.file)) == want
    assert hub.parse(Path("o/n")) is None  # a Path is always a path


def test_a_local_path_never_imports_huggingface_hub(hubcache):
    """Start-up: a local path (and `import orkpack`) loads no huggingface_hub; a hub name does."""
    code = ("import sys, runpy; sys.argv = ['orkpack', 'plan', {!r}, '--json']\n"
            "try:\n    runpy.run_module('orkpack', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('HUB' if 'huggingface_hub' in sys.modules else 'NOHUB', file=sys.stderr)")
    fixture = ROOT / "tests" / "fixtures" / "configs" / "llama.json"
    for spec, want in ((str(fixture), "NOHUB"), (REPO, "HUB")):
        r = subprocess.run([sys.executable, "-c", code.format(spec)], capture_output=True, text=True,
                           env=_env(hubcache), timeout=300)
        assert r.stderr.strip().splitlines()[-1] == want, r.stderr


# ------------------------------------------------------------------------------------------- online, at the boundary

def _fake_hub(monkeypatch, listing, commit, folder, calls, *, snapshot=None):
    """huggingface_hub's three calls replaced at its own API (the network is not reachable from the tests):
    model_info answers ``listing`` at ``commit``; the downloads record what they are asked and return ``folder``."""
    from types import SimpleNamespace

    hh = pytest.importorskip("huggingface_hub")
    info = SimpleNamespace(sha=commit, siblings=[SimpleNamespace(rfilename=f) for f in listing])
    monkeypatch.setattr(hh.HfApi, "model_info", lambda self, repo, revision=None, **kw: calls.append(
        ("info", repo, revision)) or info)

    def file(repo, filename, *, revision=None, **kw):
        calls.append(("file", filename, revision))
        return str(folder / filename)

    def snap(repo, *, revision=None, allow_patterns=None, **kw):
        calls.append(("snapshot", list(allow_patterns), revision))
        if snapshot is not None:
            raise snapshot
        return str(folder)

    monkeypatch.setattr(hh, "hf_hub_download", file)
    monkeypatch.setattr(hh, "snapshot_download", snap)
    return hh


def test_online_the_download_asks_for_the_plan_only(monkeypatch, hubcache):
    """Online: the listing comes from model_info, the index is fetched first, and snapshot_download is asked (at the
    revision given, so huggingface_hub records refs/<revision> for later offline runs) for exactly the planned files:
    huggingface_hub's own filter of the repo's whole listing by those patterns gives back that plan and nothing else."""
    filt = pytest.importorskip("huggingface_hub.utils").filter_repo_objects
    listing = sorted(_folder_files(hubcache["snap1"])) + ["flax_model.msgpack", "original/consolidated.00.pth",
                                                           "consolidated.safetensors", "model-[x].safetensors"]
    calls = []
    _fake_hub(monkeypatch, listing, C1, hubcache["snap1"], calls)
    loc = hub.locate(REPO, revision="v1")
    assert loc.path == hubcache["snap1"] and loc.origin == hub.Origin(REPO, "v1", C1)
    assert calls[0] == ("info", REPO, "v1") and calls[1] == ("file", hub.INDEX, "v1")
    kind, patterns, rev = calls[2]
    assert kind == "snapshot" and rev == "v1"
    assert sorted(filt(listing, allow_patterns=patterns)) == sorted(
        ["config.json", "tokenizer.json", "tokenizer_config.json", hub.INDEX,
         "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"])


def test_online_one_gguf_file(monkeypatch, hubcache):
    calls = []
    _fake_hub(monkeypatch, ["README.md", "tiny-F16.gguf", "tiny-Q8_0.gguf"], G1, hubcache["gsnap"], calls)
    loc = hub.locate(f"{GGUF_REPO}:tiny-Q8_0.gguf")
    assert loc.path == hubcache["gsnap"] / "tiny-Q8_0.gguf"
    assert loc.origin == hub.Origin(GGUF_REPO, "main", G1, "tiny-Q8_0.gguf")
    assert [c[0] for c in calls] == ["info", "file"]  # that one file, no snapshot
    with pytest.raises(SourceError, match=r"the repo has no file tiny-Q4_0\.gguf; its GGUF files: tiny-F16\.gguf, "
                                          r"tiny-Q8_0\.gguf$"):
        hub.locate(f"{GGUF_REPO}:tiny-Q4_0.gguf")


@pytest.mark.parametrize("err,said", [
    (OSError(104, "Connection reset by peer"), r"the download stopped \(ConnectionResetError\); run the command again: "
                                               "it resumes"),
    (OSError(28, "No space left on device"), "cannot write the Hugging Face cache"),
    (ValueError("a bug"), None),  # anything else is a bug and keeps its traceback
])
def test_online_a_download_that_fails_is_one_line(monkeypatch, hubcache, err, said):
    _fake_hub(monkeypatch, sorted(_folder_files(hubcache["snap1"])), C1, hubcache["snap1"], [], snapshot=err)
    with pytest.raises(SourceError if said else ValueError, match=said or "a bug"):
        hub.locate(REPO)


def test_online_the_hubs_refusals_are_one_line(monkeypatch):
    hh = pytest.importorskip("huggingface_hub")
    from huggingface_hub import errors

    http = pytest.importorskip(errors.Response.__module__.split(".")[0])  # the HTTP library huggingface_hub uses
    response = http.Response(404, request=http.Request("GET", "https://huggingface.co/api/models/o/n"))
    for cls, said in ((errors.RepositoryNotFoundError, "no model o/n on the Hugging Face hub"),
                      (errors.GatedRepoError, "the repo is gated; accept its terms"),
                      (errors.RevisionNotFoundError, "no revision v7 on the hub")):
        def refuse(self, repo, revision=None, _cls=cls, **kw):
            raise _cls("refused", response=response)

        monkeypatch.setattr(hh.HfApi, "model_info", refuse)
        with pytest.raises(SourceError, match=said):
            hub.locate("o/n", revision="v7")


def test_online_a_hub_error_mid_download_is_one_line(monkeypatch, hubcache):
    from huggingface_hub import errors

    http = pytest.importorskip(errors.Response.__module__.split(".")[0])
    response = http.Response(503, request=http.Request("GET", "https://huggingface.co/o/n/resolve/main/x"))
    _fake_hub(monkeypatch, sorted(_folder_files(hubcache["snap1"])), C1, hubcache["snap1"], [],
              snapshot=errors.HfHubHTTPError("503 Server Error: Service Unavailable", response=response))
    with pytest.raises(SourceError, match=r"the download failed \(503 Server Error: Service Unavailable\); run the "
                                          "command again"):
        hub.locate(REPO)
