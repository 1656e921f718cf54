"""The web server's memory and time on a decompression-bomb-like upload.

1. trains a tiny image run (a 1-layer ViT on the built-in digits, 20 steps);
2. writes a 13000 x 13000 grayscale PNG (169 million pixels, mostly zeros with a few rows of noise:
   about 0.5 MB on disk, 169 MB once decoded, four times that as float32) and an ordinary 8x8 PNG;
3. starts `attnlab serve RUN --port P` and waits until GET /api/runs answers;
4. posts the big PNG to POST /api/predict_image (multipart fields `run` and `image`), recording the
   HTTP status, the start of the body, the wall time and the server's peak resident memory during
   the request (VmRSS of /proc/PID/status sampled every 20 ms; VmHWM, the kernel's own peak, too);
5. posts it --repeat more times (stopping early when one request takes over 30 s) and reads the
   server's memory after them; then times one request with the 8x8 PNG for comparison.

Run from the repository root:
    .venv/bin/python benchmarks/upload_memory.py
    .venv/bin/python benchmarks/upload_memory.py --repeat 3 --attnlab /path/to/other/attnlab
--attnlab picks the attnlab executable (default: the one next to this Python), so the same script
measures another checkout. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

SIDE = 13_000
NOISE_ROWS = 24  # rows of random bytes: what makes the file ~0.5 MB instead of 164 KB
SLOW = 30.0  # seconds: a request slower than this ends the repeats


def default_attnlab() -> str:
    here = Path(sys.executable).with_name("attnlab")
    return str(here) if here.exists() else (shutil.which("attnlab") or "attnlab")


def png_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a, "L").save(buf, "PNG")
    return buf.getvalue()


def bomb_png() -> bytes:
    a = np.zeros((SIDE, SIDE), np.uint8)
    rows = np.linspace(0, SIDE - 1, NOISE_ROWS).astype(int)
    a[rows] = np.random.default_rng(0).integers(0, 256, (NOISE_ROWS, SIDE), dtype=np.uint8)
    return png_bytes(a)


def small_png() -> bytes:
    a = np.zeros((8, 8), np.uint8)  # a rough "1"
    a[1:7, 4] = 255
    a[2, 3] = 200
    return png_bytes(a)


def memory_mb(pid: int) -> tuple[float, float] | None:
    """(VmRSS, VmHWM) of a process in MB, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kb = {ln.split(":")[0]: int(ln.split()[1]) for ln in text.splitlines() if ln.startswith(("VmRSS", "VmHWM"))}
    if "VmRSS" not in kb:  # a zombie has no memory lines
        return None
    return kb["VmRSS"] / 1024, kb.get("VmHWM", 0) / 1024


class PeakRSS:
    """The highest VmRSS of `pid` while the block runs, sampled every `every` seconds."""

    def __init__(self, pid: int, every: float = 0.02):
        self.pid, self.every, self.peak = pid, every, 0.0
        self._stop = threading.Event()

    def _sample(self) -> None:
        while True:
            m = memory_mb(self.pid)
            if m is not None:
                self.peak = max(self.peak, m[0])
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> PeakRSS:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        m = memory_mb(self.pid)  # one last sample
        if m is not None:
            self.peak = max(self.peak, m[0])


@dataclass
class Answer:
    status: str  # the HTTP status, or the error that stood for one
    seconds: float
    body: str


def post(client: httpx.Client, run: str, data: bytes, filename: str, timeout: float) -> Answer:
    t0 = time.perf_counter()
    try:
        r = client.post(
            "/api/predict_image", data={"run": run}, files={"image": (filename, data, "image/png")}, timeout=timeout
        )
        return Answer(str(r.status_code), time.perf_counter() - t0, r.text[:200])
    except httpx.HTTPError as e:
        return Answer(f"{type(e).__name__}", time.perf_counter() - t0, str(e)[:200])


def help_has(attnlab: str, words: list[str], flag: str) -> bool:
    return flag in subprocess.run([attnlab, *words, "--help"], capture_output=True, text=True).stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = 20) -> str:
    lines = path.read_text(errors="replace").replace("\r", "\n").splitlines()
    return "\n".join([ln for ln in lines if ln.strip() and "%|" not in ln][-n:])


def train(attnlab: str, run: Path, log: Path) -> None:
    tiny = "--preset vit-nano --n-layer 1 --d-model 32 --n-head 2 --eval-batches 1"
    cmd = [attnlab, "train", "image", "--data", "digits", "--out", str(run), *tiny.split()]
    cmd += "--max-steps 20 --device cpu --dtype float32".split()
    if help_has(attnlab, ["train", "image"], "--no-progress"):
        cmd.append("--no-progress")
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    with open(log, "wb") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        sys.exit(f"training failed (exit {rc}):\n{tail(log)}")
    print(f"trained in {time.perf_counter() - t0:.1f} s", flush=True)


def wait_ready(server: subprocess.Popen, url: str, log: Path, limit: float = 180) -> list[dict]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if server.poll() is not None:
            sys.exit(f"the server exited ({server.returncode}) before answering:\n{tail(log)}")
        try:
            r = httpx.get(f"{url}/api/runs", timeout=2)
            if r.status_code == 200:
                return r.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    sys.exit(f"the server did not answer /api/runs within {limit:.0f} s:\n{tail(log)}")


def mb(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attnlab", default=default_attnlab(), help="the attnlab executable (default: the venv's)")
    more = f"uploads of the big PNG after the first (default: 100; stops after one over {SLOW:.0f} s)"
    ap.add_argument("--repeat", type=int, default=100, help=more)
    ap.add_argument("--port", type=int, default=0, help="the server's port (default: a free one)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds to wait for one request (default: 600)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (run, PNG, server log)")
    args = ap.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="upload_memory-"))
    run = root / "digits-vit"
    version = subprocess.run([args.attnlab, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"attnlab: {args.attnlab} ({version or 'no --version'})", flush=True)
    train(args.attnlab, run, root / "train.log")

    big, small = bomb_png(), small_png()
    (root / "big.png").write_bytes(big)
    print(f"big PNG: {SIDE}x{SIDE} L, {len(big) / 1e6:.2f} MB on disk, {SIDE * SIDE / 1e6:.0f} MB decoded", flush=True)

    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}"
    log = root / "serve.log"
    with open(log, "wb") as f:
        server = subprocess.Popen(
            [args.attnlab, "serve", str(run), "--port", str(port)],
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        t0 = time.monotonic()
        runs = wait_ready(server, url, log)
        name = runs[0]["name"]
        print(f"server ready in {time.monotonic() - t0:.1f} s (pid {server.pid}), run {name!r}", flush=True)
        time.sleep(1.0)  # settle
        idle = memory_mb(server.pid)
        rows = [("idle server", "-", "-", "-", mb(idle and idle[0]))]

        with httpx.Client(base_url=url) as client:
            with PeakRSS(server.pid) as peak:
                first = post(client, name, big, "big.png", args.timeout)
            after1 = memory_mb(server.pid)
            rows.append(
                ("big PNG, 1st request", first.status, f"{first.seconds:.2f}", mb(peak.peak), mb(after1 and after1[0]))
            )
            print(f"big PNG answer ({first.status}, {first.seconds:.2f} s): {first.body}", flush=True)

            answers: list[Answer] = []
            stop = ""
            with PeakRSS(server.pid) as peak_rep:
                for _ in range(args.repeat):
                    if server.poll() is not None:
                        stop = f"the server exited ({server.returncode})"
                        break
                    answers.append(post(client, name, big, "big.png", args.timeout))
                    if answers[-1].seconds > SLOW:
                        stop = f"a request took {answers[-1].seconds:.1f} s > {SLOW:.0f} s"
                        break
            after_rep = memory_mb(server.pid)
            if answers:
                statuses = {s: sum(a.status == s for a in answers) for s in dict.fromkeys(a.status for a in answers)}
                secs = [a.seconds for a in answers]
                rows.append(
                    (
                        f"big PNG, {len(answers)} more",
                        " ".join(f"{s}x{n}" for s, n in statuses.items()),
                        f"{statistics.median(secs):.2f} med, {max(secs):.2f} max",
                        mb(peak_rep.peak),
                        mb(after_rep and after_rep[0]),
                    )
                )
            if stop:
                print(f"repeats stopped after {len(answers)}: {stop}", flush=True)

            with PeakRSS(server.pid) as peak_small:
                little = post(client, name, small, "small.png", args.timeout)
            after_small = memory_mb(server.pid)
            rows.append(
                (
                    "8x8 PNG",
                    little.status,
                    f"{little.seconds:.2f}",
                    mb(peak_small.peak),
                    mb(after_small and after_small[0]),
                )
            )
            print(f"8x8 PNG answer ({little.status}, {little.seconds:.2f} s): {little.body}", flush=True)

        print()
        head = ("request", "status", "seconds", "peak RSS MB", "RSS after MB")
        widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
        for r in [head, *rows]:
            print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        hwm = memory_mb(server.pid)
        print(
            f"\nRSS: idle before {mb(idle and idle[0])} MB, after 1 request {mb(after1 and after1[0])} MB, "
            f"after the repeats {mb(after_rep and after_rep[0])} MB"
        )
        print(
            f"VmHWM (peak RSS since start): idle {mb(idle and idle[1])} MB, after 1 request "
            f"{mb(after1 and after1[1])} MB, at the end {mb(hwm and hwm[1])} MB"
        )
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        if args.keep:
            print(f"kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
