"""Read-only and permission-denied paths as a user other than root: every writer refused in
one line naming the user's path (never a lock or a staging folder of ours), exit status 2,
and every file that was there before byte-identical after.

As root the commands run as `nobody`. Where `setpriv` can start the interpreter as nobody
with its packages importable, it does; where the packages sit in a folder nobody cannot
enter (a Python under /root), a root child process loads them, runs the same command once on
paths it may use (so every lazy import has happened), then drops to nobody with the same
system calls setpriv makes (setgroups, setgid, setuid) and runs the case. As another user
the commands run as that user. Skipped where none of this is possible.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bad_input import snapshot
from tests.train_helpers import build_data, tiny_config

NOBODY = 65534  # nobody / nogroup on Debian

# runs in a child: argv[1] the warm-up's arguments (JSON list, or null), argv[2] the case's
DRIVER = """
import json, os, sys
from euler.cli.main import main

def run(args):
    sys.argv = ["euler", *args]
    try:
        main()
    except SystemExit as e:
        return e.code
    return 0

warm, case, drop = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3] == "1"
if warm is not None:
    sys.stdout.flush(); sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1); os.dup2(null, 2)
    run(warm)
    sys.stdout.flush(); sys.stderr.flush()
    os.dup2(saved[0], 1); os.dup2(saved[1], 2)
if drop:
    os.setgroups([]); os.setgid(NOBODY); os.setuid(NOBODY)
sys.exit(run(case))
""".replace("NOBODY", str(NOBODY))


def _setpriv_works() -> bool:
    """Whether setpriv starts this interpreter as nobody with euler and its packages."""
    if shutil.which("setpriv") is None:
        return False
    probe = [*_setpriv(), sys.executable, "-c", "import numba, typer, euler.cli.main"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _setpriv() -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def _mode() -> str:
    """How a case runs: 'user' (not root), 'setpriv', or 'drop' (root child, then nobody)."""
    if os.geteuid() != 0:
        return "user"
    if _setpriv_works():
        return "setpriv"
    if hasattr(os, "setgroups"):
        return "drop"
    pytest.skip("root without setpriv or setgroups: cannot run as another user")


@dataclass(frozen=True)
class Case:
    """`euler ARGS`: {ro} a folder the user may not write, {shut} a folder it may not
    enter, {secret} a file it may not read, {pre}/{sft}/{ckpt}/{book}/{alpaca} inputs it may
    read. The warm-up runs ARGS with {ro}, {shut} and {secret} replaced by usable twins."""

    id: str
    args: tuple[str, ...]
    words: tuple[str, ...]


TRAIN = ("--preset", "tiny", "--steps", "1", "--batch-size", "2", "--eval-every", "1",
         "--eval-batches", "1", "--sample-tokens", "2")  # fmt: skip
CASES = [
    Case("prepare-out-read-only", ("data", "prepare", "--books", "{book}", "--out", "{ro}/out",
         "--vocab-size", "300", "--val-fraction", "0.5"), ("--out {ro}/out", "Permission")),
    Case("prepare-out-below-read-only", ("data", "prepare", "--books", "{book}", "--out",
         "{ro}/a/b", "--vocab-size", "300", "--val-fraction", "0.5"),
         ("--out {ro}/a/b", "{ro}", "Permission")),
    Case("prepare-book-unreadable", ("data", "prepare", "--books", "{secret}", "--out",
         "{w}/out", "--vocab-size", "300", "--val-fraction", "0.5"), ("{secret}", "Permission")),
    Case("prepare-sft-out-read-only", ("data", "prepare-sft", "{alpaca}", "--tokenizer", "{pre}",
         "--out", "{ro}/sft", "--seq-len", "24"), ("--out {ro}/sft", "Permission")),
    Case("tokenizer-out-read-only", ("tokenizer", "train", "{book}/b0.txt", "--vocab-size", "300",
         "--out", "{ro}/tok.json"), ("--out {ro}/tok.json", "Permission")),
    Case("train-out-read-only", ("train", "--data", "{pre}", "--out", "{ro}/run", *TRAIN),
         ("--out {ro}/run", "Permission")),
    Case("train-data-shut", ("train", "--data", "{shut}", "--out", "{w}/run", *TRAIN),
         ("--data", "{shut}", "readable")),
    Case("eval-json-read-only", ("eval", "--checkpoint", "{ckpt}", "--text", "{pre}", "--json",
                                 "{ro}/r.json"),
         ("--json {ro}/r.json", "Permission")),
    Case("chat-checkpoint-unreadable", ("chat", "--checkpoint", "{secret}", "--prompt", "hi",
         "--max-tokens", "2"), ("--checkpoint", "{secret}", "readable")),
    Case("export-out-read-only", ("export", "--checkpoint", "{ckpt}", "--out", "{ro}/hf"),
         ("--out {ro}/hf", "Permission")),
    Case("resume-run-read-only", ("train", "--resume", "{run}", "--steps", "3"),
         ("--resume {run}", "Permission")),
    Case("sft-out-read-only", ("sft", "--checkpoint", "{ckpt}", "--data", "{sft}", "--out",
         "{ro}/sft", "--steps", "1", "--batch-size", "2", "--eval-every", "1",
         "--eval-batches", "1", "--sample-tokens", "2"), ("--out {ro}/sft", "Permission")),
]  # fmt: skip


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A folder every user may enter, holding readable inputs, and per case the denied
    places made fresh by `place`. Removed at the end."""
    import dataclasses

    from euler.tokenizer import Tokenizer

    from euler.model.config import get_preset
    from euler.model.params import ParamLayout, init_params
    from euler.training import checkpoint
    from euler.training.loop import train

    data = build_data(tmp_path_factory)
    root = Path(tempfile.mkdtemp(prefix="euler-perm-", dir="/tmp"))
    shutil.copytree(data / "pre", root / "in" / "pre")
    shutil.copytree(data / "sft", root / "in" / "sft")
    shutil.copy(data / "alpaca.json", root / "in" / "alpaca.json")
    book = "*** START OF THE PROJECT GUTENBERG EBOOK T ***\n" + ". ".join(
        f"The {w} sat on the mat and the {w} ran" for w in ("cat", "dog", "fox") * 40
    )
    for i in range(4):  # several books, so that both splits get one
        (root / "in" / "books").mkdir(parents=True, exist_ok=True)
        (root / "in" / "books" / f"b{i}.txt").write_text(book + f" {i}.\n")
    tok = Tokenizer.load(root / "in" / "pre" / "tokenizer.json")
    cfg = dataclasses.replace(get_preset("tiny"), vocab_size=tok.vocab_size)
    params = init_params(ParamLayout(cfg), 0)
    checkpoint.save(root / "in" / "ck.safetensors", cfg, params, None, {"step": 0},
                    {"kind": "pretrain"}, tok.to_json())  # fmt: skip
    train(tiny_config(root / "in" / "run", root / "in" / "pre", steps=2, sample_tokens=0))
    for p in [root, *root.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _places(root: Path, case_id: str, denied: bool) -> dict[str, str]:
    """The case's folders: {w} writable by all; {ro} read-only and {shut} closed when
    denied, else usable twins; {secret} unreadable when denied."""
    base = root / ("denied" if denied else "warm") / case_id
    shutil.rmtree(base, ignore_errors=True)
    (base / "w").mkdir(parents=True)
    (base / "ro").mkdir()
    shutil.copytree(root / "in" / "pre", base / "shut")
    shutil.copytree(root / "in" / "run", base / "run")
    secret = base / "secret.txt"
    secret.write_bytes((root / "in" / "books" / "b0.txt").read_bytes())
    for p in [base.parent, base, *base.rglob("*")]:
        os.chmod(p, 0o777 if p.is_dir() else 0o666)
    if denied:
        os.chmod(base / "ro", 0o555)
        os.chmod(base / "run", 0o755 if os.geteuid() == 0 else 0o555)
        os.chmod(base / "shut", 0o700)
        os.chmod(secret, 0o600)
        if os.geteuid() != 0:  # the user owns them: the modes alone refuse
            os.chmod(base / "shut", 0o000)
            os.chmod(secret, 0o000)
    return {
        "w": str(base / "w"), "ro": str(base / "ro"), "shut": str(base / "shut"),
        "secret": str(secret), "pre": str(root / "in" / "pre"),
        "book": str(root / "in" / "books"), "alpaca": str(root / "in" / "alpaca.json"),
        "ckpt": str(root / "in" / "ck.safetensors"), "run": str(base / "run"),
        "sft": str(root / "in" / "sft"),
    }  # fmt: skip


def _args(case: Case, places: dict[str, str]) -> list[str]:
    return [a.format(**places) for a in case.args]


def _tree(root: Path) -> dict[str, str]:
    """Every file under root with its hash, and every folder (so none may be added)."""
    files = snapshot(root)
    folders = {str(p.relative_to(root)): "folder" for p in root.rglob("*") if p.is_dir()}
    return {**files, **folders}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_denied_path_is_named_in_one_line(case, scratch):
    mode = _mode()
    warm_places = _places(scratch, case.id, denied=False)
    places = _places(scratch, case.id, denied=True)
    # a secret checkpoint: the case's secret file is a copy of the checkpoint
    if case.id.startswith("chat-"):
        for p in (warm_places, places):
            Path(p["secret"]).write_bytes((scratch / "in" / "ck.safetensors").read_bytes())
    warm = _args(case, warm_places) if mode == "drop" else None
    before = _tree(scratch / "denied")
    env = {**os.environ, "COLUMNS": "200"}
    if mode == "setpriv":
        cmd = [*_setpriv(), sys.executable, "-c", DRIVER, "null", json.dumps(_args(case, places)),
               "0"]  # fmt: skip
    else:
        cmd = [sys.executable, "-c", DRIVER, json.dumps(warm), json.dumps(_args(case, places)),
               "1" if mode == "drop" else "0"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd="/")
    err = res.stderr.strip()
    assert "Traceback" not in res.stdout + err, err
    assert res.returncode == 2, f"exit {res.returncode}; stderr: {err}"
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    missing = [w.format(**places) for w in case.words]
    assert not [w for w in missing if w not in lines[0]], f"{lines[0]!r} lacks {missing}"
    assert ".lock-" not in lines[0] and ".tmp-" not in lines[0], lines[0]
    assert _tree(scratch / "denied") == before, "the command changed or added files"
