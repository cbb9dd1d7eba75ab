"""No lost work, no damaged pack: a build killed at any moment (SIGKILL, Ctrl-C),
a full disk, a read-only folder, two builds racing to one path. The target path
always holds nothing, the previous complete pack, or the new complete pack."""
from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orkpack.build import BuildOptions, build
from orkpack.errors import OrkError
from orkpack.pack.writer import PARTIAL_SUFFIX, PackWriter, clean_orphans, partial_owner
from orkpack.runtime.verify import verify_pack
from orkpack.synth import write_hf_model

ROOT = Path(__file__).resolve().parents[1]
NEW = ["blk.0.attn_q.weight"]  # the options of "the new build"
OLD = ["blk.1.ffn_up.weight"]  # the options the previous pack was built with

# a build in a child process; prints P after each tensor. With "pause" it then waits for a line on stdin
# before going on: the test knows exactly where the build is (N tensors handed to the writer, the temp file
# open, nothing renamed) when it signals, so no signal races the build (a loaded machine once finished
# the build before a Ctrl-C arrived).
RUNNER = textwrap.dedent(
    """
    import sys
    from orkpack.build import BuildOptions, build
    pause = sys.argv[4:] == ["pause"]
    def prog(n, name):
        print("P", flush=True)
        if pause:
            sys.stdin.readline()
    build(sys.argv[1], sys.argv[2], BuildOptions(threads=1, npu=sys.argv[3].split(",")), on_progress=prog)
    print("DONE", flush=True)
    """
)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("rel")
    m = write_hf_model(d / "model", layers=3, hidden=256, intermediate=688, vocab=512, seed=7)
    new = build(m, d / "new.orkpack", BuildOptions(threads=1, npu=NEW)).path.read_bytes()
    old = build(m, d / "old.orkpack", BuildOptions(threads=1, npu=OLD)).path.read_bytes()
    assert new != old
    return m, new, old


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _start(model: Path, out: Path, globs=NEW, *, pause: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RUNNER, str(model), str(out), ",".join(globs)]
                            + (["pause"] if pause else []), stdin=subprocess.PIPE if pause else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())


def _run_to(proc: subprocess.Popen, n: int) -> None:
    """Let a paused build (``_start(pause=True)``) hand n tensors to the writer and stop there."""
    for i in range(n):
        assert proc.stdout.readline().strip() == b"P", proc.stderr.read().decode()[-2000:]
        if i + 1 < n:
            proc.stdin.write(b"\n")
            proc.stdin.flush()


def _partials(folder: Path) -> list[Path]:
    return sorted(folder.glob("*" + PARTIAL_SUFFIX))


def _assert_target(out: Path, allowed: list[bytes | None]) -> None:
    got = out.read_bytes() if out.exists() else None
    assert got in allowed, "target holds neither the previous nor the new complete pack"
    if got is not None:
        assert verify_pack(out).exit_code == 0


@pytest.mark.parametrize("with_previous", [False, True])
def test_sigkill_at_progress_points(model, tmp_path, with_previous):
    """SIGKILL while the build is stopped after N tensors (0 .. all): the target is the previous pack (or
    absent), the temp file is an orphan naming its dead owner, and the next build cleans it."""
    m, new, old = model
    out = tmp_path / "m.orkpack"
    if with_previous:
        out.write_bytes(old)
    n_tensors = 3 * 9 + 3
    orphans: list[Path] = []
    for n in (0, 1, 5, 17, n_tensors):
        proc = _start(m, out, pause=True)
        _run_to(proc, n)  # n = 0: killed while starting up, before any temp file may exist
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        _assert_target(out, [old if with_previous else None])  # never renamed: the build was stopped
        left = [p for p in _partials(tmp_path) if p not in orphans]
        assert [partial_owner(p.name) for p in left] == ([proc.pid] if n else [proc.pid] * len(left))
        assert len(left) == 1 or n == 0  # stopped mid-write: exactly its own temp file is left behind
        orphans += left
    assert len(orphans) >= 4
    # the next build into that folder removes the orphans and succeeds
    r = build(m, out, BuildOptions(threads=1, npu=NEW))
    assert r.path.read_bytes() == new and _partials(tmp_path) == []


def test_sigkill_at_random_delays(model, tmp_path):
    m, new, old = model
    out = tmp_path / "m.orkpack"
    out.write_bytes(old)
    rng = random.Random(1234)
    t0 = time.perf_counter()
    proc = _start(m, out)
    proc.stdout.readline()
    first = time.perf_counter() - t0  # start-up: imports, opening the source
    proc.communicate()
    full = time.perf_counter() - t0  # one whole build
    assert out.read_bytes() == new
    out.write_bytes(old)
    for _ in range(6):  # kill at random moments while tensors are being written (and a little after)
        proc = _start(m, out)
        time.sleep(rng.uniform(first * 0.9, full * 1.1))
        proc.kill()
        proc.wait()
        _assert_target(out, [old, new])
    clean_orphans(tmp_path)
    assert _partials(tmp_path) == []


def test_ctrl_c_exits_130_and_removes_its_temp(model, tmp_path):
    m, new, old = model
    out = tmp_path / "m.orkpack"
    out.write_bytes(old)
    code = textwrap.dedent(
        """
        import sys, orkpack.build as b
        real = b.build
        after, seen = int(sys.argv[3]), [0]
        def wrapped(*a, on_progress=None, **k):
            def p(n, name):
                on_progress(n, name)
                seen[0] += 1
                if seen[0] == after:  # stop here until the SIGINT (stdin never gets a line)
                    print("P", flush=True)
                    sys.stdin.readline()
            return real(*a, on_progress=p, **k)
        b.build = wrapped
        from orkpack.cli import main
        sys.argv = ["orkpack", "build", sys.argv[1], "-o", sys.argv[2], "--threads", "1", "--json"]
        main()
        """
    )
    for after in (1, 6):
        proc = subprocess.Popen([sys.executable, "-c", code, str(m), str(out), str(after)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
        # the build stops in its progress callback after `after` tensors (it waits on stdin, which the test
        # never writes): the temp file is open and nothing is renamed when the SIGINT is sent
        assert proc.stdout.readline().strip() == b"P", proc.stderr.read().decode()[-2000:]
        assert len(_partials(tmp_path)) == 1 and out.read_bytes() == old
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=600)  # a hang guard only: the child exits as soon as it reads the signal
        assert proc.returncode == 130, err.decode()
        assert b"Traceback" not in err and b"interrupted" in err
        assert out.read_bytes() == old
        assert _partials(tmp_path) == []


def test_orphan_cleaning_spares_live_builds(tmp_path):
    """Only temp files whose pid is dead AND whose lock is free are removed."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / f".a.orkpack.{dead.pid}.x1.orkpack-partial"
    orphan.write_bytes(b"partial")
    mine = tmp_path / f".a.orkpack.{os.getpid()}.x2.orkpack-partial"
    mine.write_bytes(b"ours")
    other = tmp_path / "notes.txt"
    other.write_text("keep")
    nopid = tmp_path / ".a.orkpack.abc.orkpack-partial"
    nopid.write_bytes(b"unknown owner")
    # a dead pid in the name but a live process holding the lock (another pid namespace, pid reuse)
    locked = tmp_path / f".b.orkpack.{dead.pid}.x3.orkpack-partial"
    locked.write_bytes(b"live")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('L', flush=True); time.sleep(60)", str(locked)],
        stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"L"
        w = PackWriter(tmp_path / "c.orkpack", provenance={}, config=None, tiermap=None)
        assert w.cleaned == [orphan]
        w.abort()
    finally:
        holder.kill()
        holder.wait()
    assert not orphan.exists() and mine.exists() and other.exists() and nopid.exists() and locked.exists()
    assert clean_orphans(tmp_path) == [locked]  # its holder is gone now


def test_live_writer_temp_is_never_cleaned(tmp_path):
    """A second writer (another process) into the same folder leaves a running writer's temp alone."""
    w = PackWriter(tmp_path / "a.orkpack", provenance={}, config=None, tiermap=None)
    try:
        code = "import sys; from orkpack.pack.writer import clean_orphans; print(len(clean_orphans(sys.argv[1])))"
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=_env(), check=True)
        assert r.stdout.strip() == "0" and w.tmp.exists()
        assert partial_owner(w.tmp.name) == os.getpid()
    finally:
        w.abort()


def test_racing_builds_give_one_complete_pack(model, tmp_path):
    m, new, old = model
    out = tmp_path / "m.orkpack"
    for _ in range(3):
        if out.exists():
            out.unlink()
        a, b = _start(m, out, NEW), _start(m, out, OLD)
        a.communicate(), b.communicate()
        assert a.returncode == 0 and b.returncode == 0
        assert out.read_bytes() in (new, old)
        assert verify_pack(out).exit_code == 0
        assert _partials(tmp_path) == []


# -- full disk, read-only folder ----------------------------------------------

def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True).returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_enospc_real_tmpfs(model, tmp_path):
    m, new, old = model
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "512k"):
        pytest.skip("needs root to mount a small tmpfs (test_enospc_simulated covers the logic)")
    try:
        assert len(new) > 512 * 1024
        out = disk / "m.orkpack"
        with pytest.raises(OrkError, match="no space left") as e:
            build(m, out, BuildOptions(threads=1, npu=NEW))
        assert "Traceback" not in str(e.value) and "\n" not in str(e.value)
        assert not out.exists() and _partials(disk) == []
    finally:
        _umount(disk)


def test_enospc_simulated(model, tmp_path, monkeypatch):
    """Without root: the write fails with ENOSPC after 200 kB (monkeypatched); same outcome."""
    m, new, old = model
    out = tmp_path / "m.orkpack"
    out.write_bytes(old)
    real_pwrite, budget = os.pwrite, [200_000]

    def full(fd, data, offset):  # every write of the pack goes through os.pwrite (O_DIRECT or not)
        budget[0] -= len(data)
        if budget[0] < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(OrkError, match="no space left"):
        build(m, out, BuildOptions(threads=1, npu=NEW))
    assert out.read_bytes() == old and _partials(tmp_path) == []


def test_read_only_folder(model, tmp_path):
    m, new, old = model
    ro = tmp_path / "ro"
    if not _mount_tmpfs(ro, "4m"):
        pytest.skip("needs root to mount a tmpfs and remount it read-only")
    try:
        out = ro / "m.orkpack"
        out.write_bytes(old)
        assert subprocess.run(["mount", "-o", "remount,ro", str(ro)], capture_output=True).returncode == 0
        with pytest.raises(OrkError, match="Read-only file system"):
            build(m, out, BuildOptions(threads=1, npu=NEW))
        assert out.read_bytes() == old and _partials(ro) == []
    finally:
        _umount(ro)
