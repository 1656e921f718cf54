"""The last step of the chat journey, checked: a chat run exported to GGUF answers in llama.cpp as in attnlab.

    attnlab export RUN --to gguf FILE  (export_gguf)
    -> the file's tokenizer.chat_template is the run's
    -> for each of N held-out built-in instructions (attnlab.data.instructions, the test split): attnlab's
       greedy answer (decoding.chat.answers, as `attnlab chat --temperature 0` answers), llama.cpp's
       greedy answer through llama-cpp-python's own template renderer, llama.cpp's tokenizer, decoding
       loop and detokenizer (interop/llamacpp.greedy_text), and llama-cpp-python's create_chat_completion
       (temperature 0, stop at the template's end of turn), as a user of llama-cpp-python would ask
Prints one row per instruction and how many answers agree. Needs the llamacpp extra.

    .venv/bin/python benchmarks/gguf_journey.py runs/chat/sft --out /tmp/sft.gguf
    .venv/bin/python benchmarks/gguf_journey.py runs/chat/sft --out /tmp/sft-q8.gguf --type q8_0
"""

from __future__ import annotations

import argparse

import gguf
import torch

import attnlab
from attnlab.data.finetune import TEST_SEED
from attnlab.data.instructions import instructions
from attnlab.decoding.chat import answers
from attnlab.interop.gguf_out import export_gguf
from attnlab.interop.llamacpp import greedy_text
from attnlab.runs.adapted import run_template


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", help="a chat run (attnlab train sft / dpo)")
    p.add_argument("--out", required=True, help="the .gguf file to write (replaced)")
    p.add_argument("--type", default="f32", help="f32, f16, q8_0, q4_0")
    p.add_argument("-n", type=int, default=12, help="held-out instructions")
    p.add_argument("--max-new-tokens", type=int, default=48)
    args = p.parse_args()
    from llama_cpp import Llama  # the llamacpp extra
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    torch.set_num_threads(1)
    print(export_gguf(args.run, args.out, args.type, force=True))
    carried = gguf.GGUFReader(args.out).fields["tokenizer.chat_template"].contents()
    template, run = run_template(args.run), attnlab.load(args.run, device="cpu")
    print("the file's chat template is the run's:", carried == template.source)
    convs = instructions("test", args.n, TEST_SEED)
    held = [c.messages[:-1] for c in convs]
    ours = answers(
        run.model, run.tokenizer, template, held, temperature=0, max_new_tokens=args.max_new_tokens, dtype="float32"
    )
    render = Jinja2ChatFormatter(carried, eos_token="", bos_token="")
    llm = Llama(args.out, n_ctx=run.model.cfg.context, n_threads=1, verbose=False)
    same = same_api = right = 0
    for conv, messages, answer in zip(convs, held, ours, strict=True):
        plain = [{"role": m.role, "content": m.content} for m in messages]
        theirs = greedy_text(args.out, render(messages=plain).prompt, args.max_new_tokens, template.end_of_turn())
        api = llm.create_chat_completion(
            plain, temperature=0, max_tokens=args.max_new_tokens, stop=[template.end_of_turn()]
        )["choices"][0]["message"]["content"]
        same, same_api = same + (theirs.strip() == answer), same_api + (api.strip() == answer)
        right += answer == conv.messages[-1].content
        asked = " | ".join(m.content for m in messages if m.role == "user")
        print(
            f"{asked!r:45} right {conv.messages[-1].content!r:10} attnlab {answer!r:10} llama.cpp "
            f"{theirs.strip()!r:10} create_chat_completion {api.strip()!r}"
        )
    print(
        f"llama.cpp's greedy answer is attnlab's: {same}/{len(held)}; create_chat_completion's: {same_api}/"
        f"{len(held)}; attnlab's answers right: {right}/{len(held)}"
    )


if __name__ == "__main__":
    main()
