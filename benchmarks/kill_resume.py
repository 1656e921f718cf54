"""Crash safety of a training run: SIGKILL `attnlab train lm` at random moments, then use what it left.

Each trial trains a tiny GPT (1 layer, width 32, checkpoints every 2 steps) in a subprocess, in a
fresh temporary folder, and kills it (its whole process group) with SIGKILL after a random delay:
the first 3 delays fall in the first second after launch (imports), the next 5 in [1, 6] s (the run
folder being created, the tokenizer, the step-0 checkpoint), the others are uniform in [0, 0.8 T],
so that the run is still going, T being the time one full run takes (measured once: the first trial
that re-runs the command from scratch times it, or a run of its own when none does; or given with
--run-seconds). The run folder left behind must be usable:

  (a) it holds a checkpoint (train_state.safetensors): `attnlab train lm --out RUN --resume
      --max-steps M` exits 0 and leaves the checkpoint at step M, M being 4 steps more than the
      checkpoint had; or
  (b) it holds no checkpoint yet: re-running the exact original command (no --resume, no --force)
      exits 0 and trains to the end.

Anything else is a failure, recorded with the command and its stderr. One line per trial:
    trial i: killed at X.XXs, state (files found), outcome (resumed | restarted | FAILED: message)
then `K of N trials left a usable run`; the exit code is 1 if any trial failed.

Run from the repository root (about 3.5 minutes on 2 idle CPU cores with the defaults):
    .venv/bin/python benchmarks/kill_resume.py
    .venv/bin/python benchmarks/kill_resume.py --trials 5 --seed 1 --jobs 1
The subprocesses run with OMP_NUM_THREADS=1; --jobs trials run at the same time (default 2, one per core
of a 2-core machine; T is measured under the same load).
"""

from __future__ import annotations

import argparse
import inspect
import json
import json.decoder
import json.encoder
import json.scanner
import os
import random
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

FILES = ("config.json", "model.safetensors", "train_state.safetensors", "attnlab.json")
STATE = "train_state.safetensors"
MAX_STEPS = 200
EXTRA_STEPS = 4  # a resume trains this many steps past the checkpoint
EARLY = 3  # trials killed within the first second
STARTING = 5  # trials killed in [1, 6] s: the run folder exists, its first checkpoint may not
STEP_TIMEOUT = 300  # seconds for a resume or a restart


def default_attnlab() -> str:
    """The attnlab next to this Python (the venv's), else the one on PATH."""
    here = Path(sys.executable).with_name("attnlab")
    return str(here) if here.exists() else (shutil.which("attnlab") or "attnlab")


def write_corpus(folder: Path, size: int = 20_000) -> Path:
    """~`size` characters of Python source from the standard library, repeated if need be."""
    text = "".join(inspect.getsource(m) for m in (json, json.decoder, json.encoder, json.scanner))
    while len(text) < size:
        text += text
    path = folder / "corpus.txt"
    path.write_text(text[:size], encoding="utf-8")
    return path


def has_flag(attnlab: str, flag: str) -> bool:
    out = subprocess.run([attnlab, "train", "lm", "--help"], capture_output=True, text=True, env=env())
    return flag in out.stdout


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass
class Setup:
    attnlab: str
    corpus: Path
    quiet: list[str]  # ["--no-progress"] where the CLI has it

    def train(self, run: Path) -> list[str]:
        tiny = "--preset gpt-nano --n-layer 1 --d-model 32 --n-head 2 --context 32 --batch-size 8"
        rest = f"--eval-interval 2 --eval-batches 1 --device cpu --dtype float32 --max-steps {MAX_STEPS}"
        where = ["--data", str(self.corpus), "--out", str(run)]
        return [self.attnlab, "train", "lm", *where, *f"{tiny} {rest}".split(), *self.quiet]

    def resume(self, run: Path, steps: int) -> list[str]:
        return [self.attnlab, "train", "lm", "--out", str(run), "--resume", "--max-steps", str(steps), *self.quiet]


def checkpoint_step(run: Path) -> int | None:
    """The step in train_state.safetensors' metadata (read from the header: no attnlab import)."""
    try:
        with open(run / STATE, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        return int(header["__metadata__"]["step"])
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None


def state_of(run: Path) -> str:
    """Which of the run files exist (and how many temporary files a save left)."""
    if not run.exists():
        return "no folder"
    names = [p.name for p in run.iterdir()]
    found = [f for f in FILES if f in names]
    tmp = sum(".tmp-" in n for n in names)
    text = " / ".join(found) if found else "empty folder" if not names else "none of the run files"
    return text + (f" + {tmp} temporary file{'s' * (tmp > 1)}" if tmp else "")


def last_line(stderr: str) -> str:
    """The last line of stderr that is not a progress bar."""
    lines = [ln.strip() for ln in stderr.replace("\r", "\n").splitlines()]
    lines = [ln for ln in lines if ln and "%|" not in ln]
    return lines[-1] if lines else "(no stderr)"


def stderr_tail(stderr: str, n: int = 15) -> str:
    lines = [ln.rstrip() for ln in stderr.replace("\r", "\n").splitlines()]
    return "\n".join([ln for ln in lines if ln.strip() and "%|" not in ln][-n:])


def run_cmd(cmd: list[str], timeout: float = STEP_TIMEOUT) -> tuple[int, str]:
    try:
        p = subprocess.run(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env(), timeout=timeout
        )
        return p.returncode, p.stderr
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return -1, err + f"\n(timed out after {timeout:.0f} s)"


@dataclass
class Trial:
    index: int
    delay: float
    killed_at: float = 0.0
    exited: int | None = None  # the return code when the run ended before the kill
    state: str = ""
    outcome: str = ""
    ok: bool = False
    failure: dict = field(default_factory=dict)
    full_seconds: float | None = None  # a successful re-run from scratch: how long a full run takes

    def line(self) -> str:
        when = f"killed at {self.killed_at:.2f}s"
        if self.exited is not None:
            when = f"kill due at {self.delay:.2f}s, but the run had already exited {self.exited}"
        return f"trial {self.index}: {when}, state ({self.state}), outcome ({self.outcome})"


def launch_and_kill(cmd: list[str], delay: float, log: Path) -> tuple[float, int | None]:
    """Start cmd, SIGKILL its process group `delay` seconds after launch; (seconds, exit code if it
    ended by itself first)."""
    with open(log, "wb") as err:
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env(), start_new_session=True)
        try:
            rc = p.wait(timeout=delay)
            return time.monotonic() - t0, rc
        except subprocess.TimeoutExpired:
            pass
        os.killpg(p.pid, signal.SIGKILL)
        at = time.monotonic() - t0
        p.wait()
        return at, None


def trial(setup: Setup, index: int, delay: float, root: Path) -> Trial:
    t = Trial(index, delay)
    folder = Path(tempfile.mkdtemp(prefix=f"trial{index}-", dir=root))
    run = folder / "run"
    original = setup.train(run)
    t.killed_at, t.exited = launch_and_kill(original, delay, folder / "killed.stderr")
    t.state = state_of(run)
    if (run / STATE).exists():
        step = checkpoint_step(run)
        target = (MAX_STEPS if step is None else step) + EXTRA_STEPS
        cmd, kind = setup.resume(run, target), "resumed"
        what = f"step {step} -> {target}" if step is not None else f"unreadable step -> {target}"
    else:
        cmd, kind, target, what = original, "restarted", MAX_STEPS, "from scratch"
    t0 = time.monotonic()
    rc, stderr = run_cmd(cmd)
    seconds = time.monotonic() - t0
    after = checkpoint_step(run)
    if rc != 0:
        message = f"exit {rc}: {last_line(stderr)}"
    elif after != target:
        message = f"exit 0 but {STATE} is at step {after}, not {target}"
    else:
        t.ok, t.outcome = True, f"{kind}, {what}"
        t.full_seconds = seconds if kind == "restarted" else None
        shutil.rmtree(folder, ignore_errors=True)
        return t
    t.outcome = f"FAILED: {'resume' if kind == 'resumed' else 're-run'} {message}"
    t.failure = {"command": shlex.join(cmd), "stderr": stderr_tail(stderr), "folder": str(folder)}
    return t


def measure(setup: Setup, root: Path) -> float:
    """Seconds one full run takes (it must succeed)."""
    run = Path(tempfile.mkdtemp(prefix="full-", dir=root)) / "run"
    t0 = time.monotonic()
    rc, stderr = run_cmd(setup.train(run))
    seconds = time.monotonic() - t0
    if rc != 0:
        sys.exit(
            f"the training command fails by itself (exit {rc}):\n{shlex.join(setup.train(run))}\n{stderr_tail(stderr)}"
        )
    shutil.rmtree(run.parent, ignore_errors=True)
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20, help="how many kills (default: 20)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill times (default: 0)")
    ap.add_argument("--jobs", type=int, default=2, help="trials run at the same time (default: 2)")
    ap.add_argument("--run-seconds", type=float, default=None, help="T, the time a full run takes; default: measured")
    ap.add_argument("--attnlab", default=default_attnlab(), help="the attnlab executable (default: the venv's)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders (failed trials' are kept)")
    args = ap.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="kill_resume-"))
    quiet = ["--no-progress"] if has_flag(args.attnlab, "--no-progress") else []
    setup = Setup(args.attnlab, write_corpus(root), quiet)
    rng = random.Random(args.seed)
    print(f"command: {shlex.join(setup.train(Path('RUN')))}", flush=True)
    if not quiet:
        print("(this attnlab has no --no-progress: the command runs without it)", flush=True)

    t_start = time.monotonic()
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        # The first-second trials need no T; the first of them that re-runs the command from scratch
        # (they all should: no checkpoint is written within a second) measures it.
        early = [pool.submit(trial, setup, i, rng.uniform(0, 1.0), root) for i in range(min(EARLY, args.trials))]
        T, how = args.run_seconds, "given"
        for f in [] if T else as_completed(early):
            if f.result().full_seconds:
                T, how = f.result().full_seconds, f"measured: trial {f.result().index}'s re-run"
                break
        if not T:
            T, how = measure(setup, root), "measured: one run"
        n_start = min(STARTING, args.trials - len(early))
        print(
            f"a full run takes T = {T:.1f} s ({how}); kill times: {len(early)} in [0, 1] s, {n_start} in "
            f"[1, 6] s, the rest in [0, {0.8 * T:.1f}] s; seed {args.seed}",
            flush=True,
        )
        late = [pool.submit(trial, setup, len(early) + i, rng.uniform(1.0, 6.0), root) for i in range(n_start)]
        late += [
            pool.submit(trial, setup, i, rng.uniform(0, 0.8 * T), root)
            for i in range(len(early) + n_start, args.trials)
        ]
        trials = []
        for f in early + late:
            trials.append(f.result())
            print(trials[-1].line(), flush=True)

    good = sum(t.ok for t in trials)
    for t in trials:
        if not t.ok:
            print(f"\ntrial {t.index} failed; folder kept: {t.failure['folder']}\n$ {t.failure['command']}")
            print(t.failure["stderr"] or "(no stderr)")
    print(f"\n{good} of {len(trials)} trials left a usable run ({time.monotonic() - t_start:.0f} s in all)")
    if args.keep or good < len(trials):
        print(f"temporary folders: {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if good == len(trials) else 1


if __name__ == "__main__":
    sys.exit(main())
