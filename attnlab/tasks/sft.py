"""sft: supervised fine-tuning of a pretrained GPT on conversations, every weight or LoRA adapters.

attnlab train sft --init runs/base --data instructions --out runs/sft [--lora-rank 8 --quantize-base nf4]

Each conversation is rendered with the run's chat template; the loss reads the assistant's turns
(--train-on assistant, the default) or every token (--train-on all). After training, eval.json holds
the share of held-out instructions answered exactly.
"""

from __future__ import annotations

from typing import Any

from attnlab.data.chat import ChatTemplate
from attnlab.data.conversations import Conversation
from attnlab.data.finetune import ChatData, test_split
from attnlab.data.supervised import Example, Supervised, encode
from attnlab.data.tokenizers import Tokenizer
from attnlab.engine.session import Session
from attnlab.engine.train import Prepared, TrainRequest
from attnlab.nn.objective import inner
from attnlab.runtime.distributed import Dist
from attnlab.tasks.adapt import Adapting

EXACT = "answering the held-out instructions"  # the bar of the final scoring


class SupervisedFineTuning(Adapting):
    name = "sft"
    help = "supervised fine-tuning of a pretrained GPT on conversations (every weight, or LoRA)"
    description = (
        "Fine-tune a GPT run or a HuggingFace checkpoint (--init) on instructions or chats: the "
        "built-in generated instructions, or a JSON/JSONL file of conversations."
    )
    noun = "a fine-tuned (sft)"
    data_config = ChatData
    unit = "conversation"
    builtin = "instructions"

    def encode_row(self, row: Conversation, tok: Tokenizer, template: ChatTemplate, data: ChatData) -> Example:
        return encode(row, template, tok, data.train_on)

    def prepare(self, req: TrainRequest, d: Dist) -> Prepared:
        e = self.encoded(req)
        test = test_split(req.data, self.builtin)
        return Prepared(
            Supervised(e.parts, req.train.batch_size),
            self.builder(req, e.model),
            self.run_config(req, e.model),
            state=(e.tok, e.template, test),
        )

    def test_scores(self, s: Session, prepared: Prepared, req: TrainRequest) -> dict[str, Any] | None:
        tok, template, test = prepared.state
        show = EXACT if req.progress and s.dist.main else None
        return self.exact(inner(s.raw).eval(), tok, template, test, show) if test else None
