"""What each command takes, as small dataclasses: the parser is generated from them (cli/generate.py).

Options shared by several commands are declared once and inherited: where a model runs (--device),
which heads to take out (--keep / --remove), a JSON answer (--json).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnlab.cli.choices import (
    INSPECTIONS,
    PATCH_GRANULARITIES,
    PATCH_METHODS,
    PATCH_METRICS,
    PLOTS,
    PROJECTIONS,
    QUANTIZED,
    SPLITS,
    VIEW_NAMES,
    architectures,
)
from attnlab.config import option
from attnlab.decoding.settings import COMPILE_HELP, PREFILL_BUDGET, Draw, Speculates, check_length

HEADS = "heads (see what they do by taking them out)"


@dataclass
class OnDevice:
    device: str = option("auto", "where the model runs: auto, cpu, cuda, cuda:N or mps")


@dataclass
class ReadsRun(OnDevice):
    run: str = option("", "run directory", positional=True)


@dataclass
class Quantizes:
    quantize: str | None = option(
        None,
        "decode from weights stored small: int8 (per output channel), int4 (groups "
        "of 32) or bf16; the blocks' matrices and the LM head, each kept float32 where "
        "this machine measured float32 faster for its shape (a run written by attnlab "
        "quantize already is quantized)",
        QUANTIZED,
    )


@dataclass
class Answers:
    json: bool = option(False, "print one JSON object")


@dataclass
class HeadsOut:
    remove: str | None = option(
        None,
        "zero these heads' outputs: LAYER.HEAD from 1, comma-separated (2.3,1.1); a "
        "layer alone (2) is all its heads; encoder-decoder: encoder:, decoder: or cross: "
        "before it",
        metavar="HEADS",
        group=HEADS,
    )
    keep: str | None = option(
        None,
        "zero every other head of the same attention: only these remain (same syntax as --remove)",
        metavar="HEADS",
        group=HEADS,
    )


@dataclass
class WritesFiles:
    """A command that writes files the user names (their flags carry `writes=`: runs/outputs.py)."""

    force: bool = option(False, "replace an output file that exists (never one inside a run folder)")


PICTURE, PAGE = (".png", ".svg", ".json"), (".png", ".svg", ".html", ".json")


@dataclass
class DemoOptions:
    out: str = option(
        "runs/demo",
        "run directory (a free name is picked if it exists; with --chat, the chain's "
        "folder: run again, it goes on where it stopped)",
    )
    time_budget: str = option("2m", "minutes of training (90s, 2m, 1.5h)")
    max_steps: int | None = option(None, "train for this many steps instead of a budget", at_least=1)
    chat: bool = option(
        False,
        "the assistant chain instead (about 14 minutes on a quiet 2-core CPU; Ctrl-C, then "
        "the same command goes on where it stopped): pretrain a small base, fine-tune it on "
        "instructions (sft), tune it on preferences (dpo), train a reward model and sample "
        "best-of-8 through it, then tune the sft run by RL (grpo); --out defaults to "
        "runs/chat; `attnlab report OUT` draws its report card",
    )
    base: str | None = option(None, "with --chat: start from this GPT run instead of pretraining a base", metavar="RUN")
    seed: int | None = option(
        None, "with --chat: every stage's seed (default: each stage's own); a chain keeps the seed it started with"
    )


@dataclass
class PredictOptions(WritesFiles, Answers, HeadsOut, ReadsRun):
    text: str = option(
        "",
        'text to read (for a masked-LM run put [MASK] in it: "import [MASK]"); for an image run, an image file',
        positional=True,
    )
    top_k: int | None = option(
        None, "candidates per [MASK] (default: 5), classes shown for an image (default: 3)", at_least=1
    )
    beam: int = option(1, "translation and caption runs: beam width, 1 = greedy", at_least=1)
    attention: str | None = option(
        None,
        "translation runs: draw the alignment; ViT runs: draw [CLS]'s attention "
        "to each patch over the image (.png, .svg or .json); caption runs: where each "
        "word looked, one panel per word and head (.png, .svg, .json, or .html: a page "
        "where hovering a word moves the attention)",
        metavar="FILE",
        writes=PAGE,
    )


@dataclass
class EmbedOptions(Answers, ReadsRun):
    texts: list[str] = option(None, "texts to embed", positional=True, nargs="+", metavar="TEXT")
    pooling: str = option(
        "auto",
        "auto (the family's default: a GPT's last token, an encoder's mean or a [CLS]-trained "
        "classifier's [CLS]), last, mean or cls, where the family offers it",
    )
    dimensions: int | None = option(None, "keep the first N dimensions, normalised again", at_least=1)
    truncate: bool = option(False, "read a text over the context by its first tokens (else an error)")


@dataclass
class TranslateOptions(WritesFiles, Answers, HeadsOut, ReadsRun):
    text: str = option("", "source text", positional=True)
    beam: int = option(1, "beam width; 1 is greedy decoding", at_least=1)
    attention: str | None = option(
        None, "also draw the alignment (cross-attention): .png, .svg or .json", metavar="FILE", writes=PICTURE
    )


@dataclass
class Drafts:
    draft: str | None = option(
        None,
        "a draft model for --speculate draft or auto: a run with the same tokenizer, small and fast (e.g. 2 "
        "layers trained on the same data)",
        metavar="RUN",
    )


@dataclass
class SampleOptions(Drafts, Quantizes, HeadsOut, ReadsRun):
    num_samples: int = option(
        1, "how many samples, drawn 64 at a time as one batch, each batch printed when done", at_least=1
    )
    chat: str | None = option(
        None,
        "answer MESSAGE as a user's turn: rendered with the run's chat template, only "
        "the answer printed (it ends at the template's end of turn); not with --prompt or "
        "--stop",
        metavar="MESSAGE",
    )
    best_of: int = option(
        1,
        "with --chat and --reward: draw N answers and print the one the reward model scores highest (best-of-N)",
        at_least=1,
        metavar="N",
    )
    reward: str | None = option(
        None, "a reward run (attnlab train reward) that scores --best-of's answers", metavar="RUN"
    )


@dataclass
class ChatOptions(Drafts, Speculates, Quantizes, ReadsRun, Draw):
    system: str | None = option(
        None, "a system message that opens the conversation (kept when the oldest turns are dropped)", metavar="TEXT"
    )
    max_new_tokens: int = option(256, "an answer's length at most, in tokens (and never past the context)", at_least=1)
    reserve: int | None = option(
        None,
        "tokens of the context kept free for the answer: older turns are dropped "
        "when the prompt leaves less (default: the longest answer in the run's training "
        "data, at most --max-new-tokens; without such data, min(--max-new-tokens, half "
        "the context))",
        at_least=1,
        metavar="N",
    )
    compile: bool = option(True, COMPILE_HELP)

    def __post_init__(self):
        """How answers draw (Draw's fields, answer k with seed + k) and their length, checked."""
        Draw.__post_init__(self)
        check_length(self.max_new_tokens)
        self.check_speculation()


@dataclass
class EvalOptions(Quantizes, WritesFiles, Answers, ReadsRun):
    data: str | None = option(
        None,
        "file, folder or stdlib; image runs: digits, a folder of class sub-folders or "
        "a .npz, scored whole (default: the run's own data)",
    )
    glob: str | None = option(None, "files of a folder to read (default: the run's, or *)")
    split: str | None = option(
        None,
        "held-out part (same split as training), training part, or all (default: val; classifiers and taggers: test)",
        (*SPLITS, "test"),
    )
    max_tokens: int | None = option(None, "evaluate at most this many tokens", at_least=1)
    confusion: str | None = option(
        None,
        "image runs: where to draw the confusion matrix, .png, .svg or .json (default: RUN/eval_confusion.png)",
        metavar="FILE",
        writes=PICTURE,
    )
    beam: int = option(1, "translation runs: beam width, 1 = greedy", at_least=1)


@dataclass
class SizeOptions(Answers):
    preset: str = option("", "a preset name, or all", required=True)


@dataclass
class AttentionOptions(WritesFiles, ReadsRun):
    input: str = option("", "text to read (an image file for image runs)", positional=True)
    out: str = option(
        "",
        "what to write, by suffix: .png or .svg picture, .html page, .json numbers",
        required=True,
        metavar="FILE",
        writes=PAGE,
    )
    layer: int | None = option(None, "PNG, SVG, JSON: only this layer (1 = first), all its heads")
    head: int | None = option(None, "PNG, SVG, JSON: only this head of --layer (1 = first)")
    view: str | None = option(
        None, "a translation run: which attention (PNG, SVG default: cross; JSON default: all)", VIEW_NAMES
    )


@dataclass
class ReportOptions:
    folder: str = option(
        "runs/chat", "the chain's folder: the --out of `attnlab demo --chat`", positional=True, nargs="?"
    )


@dataclass
class RunsOptions:
    folder: str = option("runs", "the folder to look in: every run under it, at any depth", positional=True, nargs="?")


@dataclass
class RunsCompareOptions(WritesFiles):
    runs: list[str] = option(None, "run folders to draw together", positional=True, nargs="+", metavar="RUN")
    out: str = option(
        "",
        "picture to write: .png, .svg (vector) or .json (its numbers)",
        required=True,
        metavar="FILE",
        writes=PICTURE,
    )


@dataclass
class PlotOptions(WritesFiles):
    run: str = option("", "run directory", positional=True)
    what: str = option("", "what to draw", tuple(PLOTS), required=True)
    out: str = option(
        "",
        "picture to write: .png, .svg (vector) or .json (its numbers)",
        required=True,
        metavar="FILE",
        writes=PICTURE,
    )
    tokens: int = option(60, "embeddings: how many tokens to label", at_least=1)
    text: str | None = option(None, "experts: the text to route (default: a line of Python)")


@dataclass
class InspectOptions(WritesFiles, ReadsRun):
    text: str | None = option(
        None,
        "input text, or an image file for image runs (not needed for over-training, optional for ablate)",
        positional=True,
        nargs="?",
    )
    what: str = option("", "what to compute", tuple(INSPECTIONS), required=True)
    out: str | None = option(
        None, "by suffix: a picture (.png, .svg), a page (.html) or the numbers (.json)", metavar="FILE", writes=PAGE
    )
    on: str | None = option(
        None,
        "ablate with no text: random tokens repeated twice, the loss of their repeated "
        "half (default: repeats), or the run's validation split; other inspections refuse it",
        ("repeats", "val"),
    )


@dataclass
class PatchOptions(WritesFiles, Answers, ReadsRun):
    clean: str = option(
        "",
        "the clean input: a text (an image file for image runs; a translation run's source)",
        required=True,
        metavar="TEXT",
    )
    corrupted: str = option("", "the corrupted input, as many tokens long as --clean", required=True, metavar="TEXT")
    metric: str = option(
        "logit-diff",
        "what is measured of the answer: logit(target) - logit(wrong), p(target) or -log p(target)",
        PATCH_METRICS,
    )
    target: str | None = option(
        None, "the answer the metric reads, a token or a label (default: the clean run's top answer)", metavar="TOKEN"
    )
    wrong: str | None = option(
        None, "logit-diff's other answer (default: the corrupted run's top answer)", metavar="TOKEN"
    )
    method: str = option(
        "activation",
        "activation: run the corrupted input once per site with that site's clean "
        "value; attribution: AtP's gradient estimate of every site from one backward pass; eap, "
        "eap-ig: edge attribution over the residual graph (each sublayer output -> each later "
        "sublayer input), EAP-IG's gradients averaged over --steps points",
        PATCH_METHODS,
    )
    steps: int = option(5, "eap-ig: points on the line from the corrupted input to the clean one", at_least=1)
    granularity: list[str] = field(
        default_factory=list,
        metadata={
            "help": "what to patch, repeatable (default: all): resid (layer x position), heads (each head, all "
            "positions), components (attention, MLP and residual outputs by layer)",
            "repeat": True,
            "choices": PATCH_GRANULARITIES,
        },
    )
    out: str | None = option(
        None,
        "a picture of the effects (.png, .svg: layer x position heatmaps, tokens along x) or the numbers (.json)",
        metavar="FILE",
        writes=PICTURE,
    )
    sender: str | None = option(
        None,
        "path patching: the sender heads, LAYER.HEAD from 1 as --remove names them "
        "(cross:1.2 in an encoder-decoder); their effect through --receivers only",
        metavar="HEADS",
    )
    receivers: str | None = option(
        None, "path patching: the receiver heads (same syntax; 2 = all of layer 2)", metavar="HEADS"
    )


@dataclass
class ServeOptions(Drafts, Speculates, Quantizes, OnDevice):
    runs: list[str] = option(None, "run directories to serve", positional=True, nargs="+", metavar="RUN")
    host: str = option("127.0.0.1", "address to listen on (127.0.0.1: this machine only)")
    port: int = option(8765, "port (0: any free one)")
    api_key: str | None = option(
        None,
        "require 'Authorization: Bearer KEY' on every request but /health (default: "
        "the ATTNLAB_API_KEY environment variable; needed with a --host beyond loopback)",
        metavar="KEY",
    )
    insecure_no_key: bool = option(
        False, "serve a --host beyond loopback without a key: anyone who reaches it can use it"
    )
    allowed_hosts: str | None = option(
        None,
        "comma-separated Host header names to answer besides loopback and "
        "--host ('*': any); a name a browser page could use to reach the server "
        "(DNS rebinding) is refused",
        metavar="NAMES",
    )
    cors_origin: list[str] = field(
        default_factory=list,
        metadata={
            "help": "let web pages from ORIGIN (e.g. http://localhost:3000) call the API; repeatable (default: none, "
            "CORS off)",
            "repeat": True,
            "metavar": "ORIGIN",
        },
    )
    max_streams: int = option(32, "sequences generated at once over all requests; more get 429")
    max_batch: int = option(16, "sequences of one run decoded in one forward pass; more wait")
    prefill: int = option(
        PREFILL_BUDGET,
        "prompt tokens prefilled together in one forward pass a turn, between the running sequences' steps "
        "(longer prompts go in over several turns); 0: each prompt alone and whole before it joins",
        metavar="TOKENS",
    )
    prefix_cache_mb: float = option(
        0,
        "memory in MB for the keys of earlier prompts, reused by requests that start the same way (a "
        "system prompt seen before is not prefilled again); least recently used go first; 0: off",
        metavar="MB",
    )
    request_timeout: float = option(300.0, "a generation running longer is stopped with an error", metavar="SECONDS")
    threads: int | None = option(
        None, "CPU threads for the model (default: one per core but one, which the HTTP side keeps)"
    )
    compile: bool = option(True, COMPILE_HELP + "; a request decoded alone takes it, batched rows do not")
    transcoders: list[str] = field(
        default_factory=list,
        metadata={
            "help": "a folder of transcoders (attnlab circuits writes OUT/transcoders): the explorer draws "
            "attribution graphs of the served run they were trained on; repeatable",
            "repeat": True,
            "metavar": "DIR",
        },
    )

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be from 0 to 65535 (0: any free one), got {self.port}")
        for name in ("max_streams", "max_batch", "request_timeout", "threads"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be above 0, got {getattr(self, name)}")
        if self.prefill < 0:
            raise ValueError(f"--prefill must be 0 (off) or more tokens, got {self.prefill}")
        if self.prefix_cache_mb < 0:
            raise ValueError(f"--prefix-cache-mb must be 0 (off) or more, got {self.prefix_cache_mb}")
        self.check_speculation()
        if (self.speculate == "draft" and self.draft is None) or (self.draft and self.speculate in ("off", "prompt")):
            raise ValueError("--speculate draft and --draft RUN go together (--draft also serves --speculate auto)")


@dataclass
class ConvertOptions(Answers):
    source: str | None = option(
        None,
        f"what to convert: a HuggingFace-format model directory whose config.json names "
        f"one of {', '.join(architectures())}; or a .gguf file (llama.cpp's llama or gpt2, "
        "weights F32, F16, BF16, Q8_0, Q4_0, Q4_K or Q6_K)",
        positional=True,
        nargs="?",
        metavar="SOURCE",
    )
    from_hf: str | None = option(None, "a HuggingFace model directory: the same as giving it as SOURCE", metavar="DIR")
    out: str = option("", "run directory to create", required=True, metavar="RUN")
    force: bool = option(False, "replace --out if it is an attnlab run")

    def __post_init__(self):
        if (self.source is None) == (self.from_hf is None):
            raise ValueError(
                "convert takes one source: a HuggingFace directory or a .gguf file as SOURCE (or the "
                "directory as --from-hf DIR)"
            )


@dataclass
class ExportOptions:
    run: str = option("", "run directory", positional=True)
    to: str = option(
        "",
        "target format: hf, a HuggingFace model folder; peft, a LoRA run's adapter as PEFT's "
        "adapter folder; onnx, an ONNX file; gguf, a .gguf file for llama.cpp and ollama",
        ("hf", "peft", "onnx", "gguf"),
        required=True,
    )
    out: str = option(
        "", "directory (hf, peft), .onnx file (onnx) or .gguf file (gguf) to write", positional=True, metavar="OUT"
    )
    type: str | None = option(
        None,
        "--to gguf: how weight matrices are stored: f32, f16, q8_0 (8 bits in blocks of "
        "32), q4_0 (4 bits; the token embedding and output stay q8_0); norms and biases stay "
        "f32 (default: f32)",
        ("f32", "f16", "q8_0", "q4_0"),
    )
    force: bool = option(
        False,
        "replace OUT if it is a HuggingFace model folder (hf), a PEFT adapter folder "
        "(peft), an .onnx file (onnx) or a file (gguf)",
    )

    def __post_init__(self):
        if self.type is not None and self.to != "gguf":
            raise ValueError(f"--type is a GGUF weight type: it goes with --to gguf, not --to {self.to}")


@dataclass
class QuantizeOptions(Answers):
    run: str = option("", "language model run directory (a GPT run, or a converted Llama or Mixtral)", positional=True)
    to: str = option(
        "",
        "int8: per output channel, 1 byte a weight; int4: groups of 32, 5 bits a weight with their "
        "scales; bf16: 2 bytes a weight",
        QUANTIZED,
        required=True,
    )
    out: str = option("", "run directory to create", required=True, metavar="RUN")
    force: bool = option(False, "replace --out if it is an attnlab run")
    every_layer: bool = option(
        False,
        "pack every layer the kernel takes, also those float32 ran faster here (for "
        "the memory, or to measure what the precision costs)",
    )


@dataclass
class MergeOptions(Answers):
    run: str = option("", "LoRA run directory (its model is a base run's plus adapters)", positional=True)
    out: str = option(
        "", "run directory to create: the base's weights with the adapters folded in", required=True, metavar="RUN"
    )
    force: bool = option(False, "replace --out if it is an attnlab run")


@dataclass
class TrainVectorsOptions:
    out: str = option("", "run directory to create", required=True)
    force: bool = option(False, "replace --out if it is an attnlab run")
    data: str = option("english", "english (built in), a text file or a folder")


@dataclass
class VectorsOptions(WritesFiles, Answers):
    run: str = option("", "vectors run directory, .safetensors file, or word2vec/GloVe text file", positional=True)
    # commas=False: a word of a vectors file may hold commas (GloVe has "," and "1,000")
    neighbors: list[str] | None = option(
        None, "the nearest words to each WORD", nargs="+", metavar="WORD", commas=False
    )
    analogy: list[str] | None = option(
        None,
        "A is to B as C is to ?: the words nearest to B - A + C (man king woman -> queen)",
        nargs=3,
        metavar=("A", "B", "C"),
    )
    similarity: list[str] | None = option(None, "the cosine similarity of two words", nargs=2, metavar=("A", "B"))
    top: int = option(10, "how many words to list", at_least=1)
    analogies: str | None = option(None, "score on analogy questions (questions-words.txt)", metavar="FILE")
    wordsim: str | None = option(None, "score on similarity ratings (wordsim353.tsv): Spearman", metavar="FILE")
    export: str | None = option(
        None,
        "write the vectors: .txt/.vec (word2vec text) or .safetensors",
        metavar="FILE",
        writes=(".txt", ".vec", ".safetensors"),
    )
    plot: str | None = option(
        None, "draw words in 2-D (.png, .svg, or .json: the points)", metavar="FILE", writes=PICTURE
    )
    words: str | None = option(None, "comma-separated words to draw (default: the most frequent)")
    top_words: int = option(60, "how many frequent words to draw", at_least=1)
    arrows: list[str] = option(
        (),
        "draw an arrow from A to B for each pair (e.g. man:king woman:queen)",
        nargs="*",
        metavar="A:B",
        commas=False,
    )
    projection: str = option("pca", "2-D projection", tuple(PROJECTIONS))


@dataclass
class DoctorOptions(Answers, OnDevice):
    measure: int | None = option(
        None,
        "measure --dtype auto's choice at this width now, for training and for "
        "decoding (a few seconds), and keep what can be trusted",
        metavar="WIDTH",
        at_least=1,
    )
    clear: bool = option(
        False,
        "forget every kept measurement (dtype.json: --dtype auto's; kernels.json: "
        "--quantize's float32-or-packed choice per shape; help/: the kept help of `train TASK`; "
        "nothing else in the cache folder is touched) and say what was removed",
    )
    clear_cache: bool = option(
        False,
        "remove the converted models kept in the cache folder (its converted/ and "
        "peft/: each HuggingFace or PEFT folder given to --init, converted once; the next "
        "use converts it again) and say what was removed; the measurements (--clear), token "
        "caches and anything else there stay, a conversion under way is left to finish, and "
        "a link is removed, never followed",
    )
