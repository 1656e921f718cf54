"""Hostile files through the real command line: exit code, time, peak memory and the line printed.

    python benchmarks/hostile_cases.py [--only NAME ...] [--timeout 60] [--cap-gib 4] [--json OUT]

Each case is one `attnlab ...` process (`python -m attnlab`, so PYTHONPATH picks which attnlab runs:
point it at an older checkout to measure "before") on a file or folder built here from a tiny model:
a HuggingFace folder, a GGUF file, a PEFT adapter, fine-tuning data, made hostile as issue 55 lists.
A case runs under /usr/bin/time (peak resident memory, %M) with a wall-clock limit and a watchdog that
kills it once its resident memory passes --cap-gib: a case that would take the machine's 24 GB is
stopped at the cap and shown as "killed at the cap" (exit -9), so measuring "before" is safe.
Columns: exit code, seconds, peak MiB, whether a traceback was printed, the last line of stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

Case = Callable[[Path, Path], list[str]]  # (bases, scratch) -> attnlab's arguments
CASES: dict[str, Case] = {}


def case(name: str) -> Callable[[Case], Case]:
    def add(fn: Case) -> Case:
        CASES[name] = fn
        return fn

    return add


CHAT = [{"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]}] * 40


def make_bases(folder: Path) -> None:
    """A tiny GPT-2-like run and a Llama-like run, each exported as a HuggingFace folder; the GPT-2
    one also as a GGUF file; a chat JSONL file. Built with the attnlab that runs this script."""
    import attnlab
    from attnlab.data import DataConfig
    from attnlab.data.chat import ChatTemplate
    from attnlab.data.conversations import Message
    from attnlab.engine.config import TrainConfig
    from attnlab.interop.convert import export_hf
    from attnlab.interop.gguf_out import export_gguf
    from attnlab.models.gpt import GPTConfig

    text = "".join(ChatTemplate().render([Message(**m) for m in c["messages"]]) for c in CHAT) * 3
    (folder / "corpus.txt").write_text(text + "".join(map(chr, range(32, 127))))
    train = TrainConfig(max_steps=1, batch_size=2, device="cpu", dtype="float32", eval_interval=1, eval_batches=1)
    data = DataConfig(data=str(folder / "corpus.txt"), tokenizer="char")
    llama = {"positions": "rope", "norm_kind": "rmsnorm", "feedforward": "swiglu", "bias": False, "tie_weights": False}
    shapes = {"gpt": {"activation": "gelu_tanh"}, "llama": llama}
    for name, kw in shapes.items():
        model = GPTConfig(n_layer=2, n_head=2, d_model=32, context=128, **kw)
        attnlab.train(folder / f"{name}-run", model, train, data, progress=False)
        export_hf(folder / f"{name}-run", folder / f"{name}-hf")
    export_gguf(folder / "gpt-run", folder / "gpt.gguf")
    export_gguf(folder / "llama-run", folder / "llama.gguf")
    (folder / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CHAT))


def hf_copy(bases: Path, scratch: Path, name: str = "gpt") -> Path:
    out = scratch / "hf"
    shutil.copytree(bases / f"{name}-hf", out)
    return out


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, **changes}))


def sft(folder: Path, scratch: Path, *extra: str, data: str | None = None) -> list[str]:
    return [
        "train",
        "sft",
        "--init",
        str(folder),
        "--data",
        data or str(scratch / "chat.jsonl"),
        "--out",
        str(scratch / "out"),
        "--max-steps",
        "2",
        "--batch-size",
        "2",
        "--device",
        "cpu",
        *extra,
    ]


def template_case(name: str, template: str) -> None:
    @case(name)
    def make(bases: Path, scratch: Path) -> list[str]:
        hf = hf_copy(bases, scratch)
        (hf / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
        return sft(hf, scratch)


LOOP = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
template_case("template 'x' * 10^9", "{{ 'x' * 1000000000 }}" + LOOP)
template_case(
    "template nested range(100000) loops",
    "{% for i in range(100000) %}{% for j in range(100000) %}.{% endfor %}{% endfor %}",
)
template_case("template range(10^8)", "{% for i in range(100000000) %}{% endfor %}" + LOOP)
template_case("template self-calling macro", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")
template_case("template '%999999999s' %", "{{ '%999999999s' % 'a' }}" + LOOP)
template_case("template '{:999999999}'.format", "{{ '{:999999999}'.format('a') }}" + LOOP)
template_case("template .ljust(10**9)", "{{ 'a'.ljust(10**9) }}" + LOOP)
template_case("template 1/0", "{{ 1/0 }}" + LOOP)
template_case("template include", "{% include 'other.jinja' %}" + LOOP)


@case("config n_layer 10^6")
def _many_layers(bases: Path, scratch: Path) -> list[str]:
    hf = hf_copy(bases, scratch)
    edit_json(hf / "config.json", n_layer=1_000_000)
    return sft(hf, scratch)


@case("pickle-only folder")
def _pickle_only(bases: Path, scratch: Path) -> list[str]:
    hf = hf_copy(bases, scratch)
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(hf / "model.safetensors"), hf / "pytorch_model.bin")  # a real pickle, as old folders have
    (hf / "model.safetensors").unlink()
    return sft(hf, scratch)


@case("--lora-targets q v")
def _targets_spaces(bases: Path, scratch: Path) -> list[str]:
    return sft(bases / "gpt-run", scratch, "--lora-rank", "2", "--lora-targets", "q", "v")


@case("--lora-targets q,v")
def _targets_commas(bases: Path, scratch: Path) -> list[str]:
    return sft(bases / "gpt-run", scratch, "--lora-rank", "2", "--lora-targets", "q,v")


def gguf_case(name: str, changes: dict, model: str = "gpt") -> None:
    """A GGUF file with metadata keys replaced (written again by the gguf package)."""

    @case(name)
    def make(bases: Path, scratch: Path) -> list[str]:
        out = scratch / "bad.gguf"
        rewrite_gguf(bases / f"{model}.gguf", out, changes)
        return ["convert", str(out), "--out", str(scratch / "run")]


def rewrite_gguf(src: Path, out: Path, changes: dict) -> None:
    import gguf

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(out, arch=reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = changes.get(key, field.contents())
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, value)
        else:
            writer.add_key_value(key, value, kind)
    for key, value in changes.items():  # keys the file has not got
        if key not in reader.fields:
            writer.add_uint32(key, value)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=list(reversed([int(n) for n in t.shape])), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


gguf_case("gguf block_count 10^9", {"gpt2.block_count": 1_000_000_000})
gguf_case("gguf context_length 4e9 (uint32's largest)", {"gpt2.context_length": 2**32 - 1})
gguf_case("gguf llama context_length 4e9", {"llama.context_length": 2**32 - 1}, "llama")
gguf_case("gguf llama expert_count 10^6", {"llama.expert_count": 10**6, "llama.expert_used_count": 2}, "llama")


@case("gguf array of 2^62 elements")
def _huge_array(bases: Path, scratch: Path) -> list[str]:
    """The count of a numeric array (the tokens' types, int32) set to 2^62, in place."""
    data = bytearray((bases / "gpt.gguf").read_bytes())
    key = b"tokenizer.ggml.token_type"
    at = data.index(key) + len(key) + 4 + 4  # value type (ARRAY), element type, then the u64 count
    data[at : at + 8] = (2**62).to_bytes(8, "little")
    (scratch / "bad.gguf").write_bytes(data)
    return ["convert", str(scratch / "bad.gguf"), "--out", str(scratch / "run")]


@case("hf context 10^12 (llama): convert")
def _huge_context(bases: Path, scratch: Path) -> list[str]:
    hf = hf_copy(bases, scratch, "llama")
    edit_json(hf / "config.json", max_position_embeddings=10**12)
    return ["convert", str(hf), "--out", str(scratch / "run")]


@case("hf context 10^12 (llama): convert, then sample")
def _huge_context_sampled(bases: Path, scratch: Path) -> list[str]:
    convert = [sys.executable, "-m", "attnlab", *_huge_context(bases, scratch)]
    subprocess.run(convert, capture_output=True, timeout=120)  # refused now (no run); an older attnlab converted
    return ["sample", str(scratch / "run"), "--max-new-tokens", "4", "--device", "cpu"]


@case("hf rope_scaling section")
def _rope_scaling(bases: Path, scratch: Path) -> list[str]:
    hf = hf_copy(bases, scratch, "llama")
    edit_json(hf / "config.json", rope_scaling={"rope_type": "linear", "factor": 4.0})
    return ["convert", str(hf), "--out", str(scratch / "run")]


@case("hf negative norm epsilon")
def _negative_eps(bases: Path, scratch: Path) -> list[str]:
    hf = hf_copy(bases, scratch, "llama")
    edit_json(hf / "config.json", rms_norm_eps=-1e-5)
    return ["convert", str(hf), "--out", str(scratch / "run")]


def peft_case(name: str, **changes) -> None:
    @case(name)
    def make(bases: Path, scratch: Path) -> list[str]:
        from attnlab.interop.adapter_runs import export_peft

        run = scratch / "lora"
        train = sft(bases / "gpt-run", scratch, "--lora-rank", "2")
        train[train.index(str(scratch / "out"))] = str(run)
        subprocess.run([sys.executable, "-m", "attnlab", *train], capture_output=True, timeout=300, check=True)
        export_peft(run, scratch / "peft")
        edit_json(scratch / "peft" / "adapter_config.json", **changes)
        return sft(scratch / "peft", scratch)


peft_case("peft r 0", r=0)
peft_case("peft lora_alpha 'big'", lora_alpha="big")
peft_case("peft lora_dropout 2", lora_dropout=2)
peft_case("peft alpha_pattern [1]", alpha_pattern=[1])


def data_case(name: str, write: Callable[[Path], None], task: str = "sft") -> None:
    @case(name)
    def make(bases: Path, scratch: Path) -> list[str]:
        path = scratch / "data.jsonl"
        write(path)
        args = sft(bases / "gpt-run", scratch, data=str(path))
        return args if task == "sft" else ["train", task, *args[2:]]


def lines(rows: list, path: Path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def pairs(chosen: str, rejected: str) -> list[dict]:
    return [{"prompt": "What is 2 + 2?", "chosen": chosen, "rejected": rejected}] * 40


data_case('data {"messages": "hello"}', lambda p: lines([{"messages": "hello"}] * 40, p))
data_case("data chosen == rejected (dpo)", lambda p: lines(pairs("4", "4"), p), task="dpo")
data_case("data a million tiny rows", lambda p: lines([{"prompt": "a", "completion": "b"}] * 1_000_000, p))
data_case(
    "data one 10,000-turn conversation",
    lambda p: lines(
        [{"messages": [{"role": r, "content": "hi"} for _ in range(5000) for r in ("user", "assistant")]}] * 2, p
    ),
)
data_case("data a 100 MB line", lambda p: lines([{"prompt": "a", "completion": "b" * 100_000_000}] + CHAT, p))
data_case(
    "data raw U+2028 in JSONL",
    lambda p: p.write_text(
        "".join(json.dumps(c, ensure_ascii=False).replace("2 + 2", "2\u20282") + "\n" for c in CHAT)
    ),
)
data_case("data invalid UTF-8", lambda p: p.write_bytes(b'{"prompt": "\xff\xfe", "completion": "b"}\n' * 40))
data_case("data nesting 100,000 deep", lambda p: p.write_text("[" * 100_000 + "]" * 100_000 + "\n"))


def peak_rss_kib(pid: int) -> int:
    """Resident memory of a process and its children (KiB), from /proc."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except (OSError, StopIteration, ValueError):
            continue
    return total


def run_case(args: list[str], scratch: Path, timeout: float, cap_gib: float) -> dict:
    """One attnlab process: exit code, seconds, peak MiB (/usr/bin/time's %M), the stderr's last line."""
    report = scratch / "time.txt"
    cmd = ["/usr/bin/time", "-f", "%e %M", "-o", str(report), sys.executable, "-m", "attnlab", *args]
    env = {**os.environ, "ATTNLAB_CACHE": str(scratch / "cache"), "PYTHONDONTWRITEBYTECODE": ""}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
    capped, seen, start = [], [0], time.perf_counter()

    def watch() -> None:  # also the peak where /usr/bin/time is killed before it can say
        while proc.poll() is None:
            seen[0] = max(seen[0], peak_rss_kib(proc.pid))
            if seen[0] > cap_gib * 2**20:
                capped.append(True)
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    try:
        err = proc.communicate(timeout=timeout)[1].decode(errors="replace")
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        err = proc.communicate()[1].decode(errors="replace") + f"\n(still running after {timeout:.0f} s: killed)"
    took = time.perf_counter() - start
    measured = report.read_text().split() if report.is_file() else []
    peak = int(measured[-1]) // 1024 if measured and measured[-1].isdigit() else seen[0] // 1024
    said = [line for line in err.splitlines() if line.strip()]
    last = f"(killed at the {cap_gib:g} GiB cap)" if capped else (said[-1] if said else "")
    return {
        "exit": proc.returncode,
        "seconds": round(took, 1),
        "peak_mib": peak,
        "traceback": "Traceback" in err,
        "line": last,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", help="cases whose name contains one of these")
    p.add_argument("--timeout", type=float, default=60, help="seconds a case may run (default: 60)")
    p.add_argument("--cap-gib", type=float, default=4, help="kill a case above this resident memory (default: 4)")
    p.add_argument("--json", help="also write the rows here")
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="attnlab-hostile-"))
    (root / "bases").mkdir()
    make_bases(root / "bases")
    rows = []
    print("| case | exit | s | peak MiB | traceback | last line |\n|---|---|---|---|---|---|")
    for name, make in CASES.items():
        if a.only and not any(o in name for o in a.only):
            continue
        scratch = root / f"case-{len(rows)}"
        scratch.mkdir()
        shutil.copy(root / "bases" / "chat.jsonl", scratch / "chat.jsonl")
        try:
            row = {"case": name, **run_case(make(root / "bases", scratch), scratch, a.timeout, a.cap_gib)}
        except Exception as e:  # a case that could not be built (the older attnlab lacks a piece): say so
            row = {
                "case": name,
                "exit": None,
                "seconds": None,
                "peak_mib": None,
                "traceback": None,
                "line": f"(not built: {type(e).__name__}: {e})",
            }
        rows.append(row)
        line = row["line"][:150].replace("|", "/")
        print(
            f"| {name} | {row['exit']} | {row['seconds']} | {row['peak_mib']} | {row['traceback']} | {line} |",
            flush=True,
        )
        shutil.rmtree(scratch, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
