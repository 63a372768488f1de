"""The front door of generation: `open_model(path)` reads a GGUF model once (its vocabulary, its
metadata, the program that computes it), decides the things a caller should not (the KV cache's
size, the threads, the sampler chain with the model's defaults, the chat prompt's tokens), and
`Model.generator(...)` gives a `Generator` that runs it token after token, keeping its KV cache
between calls (a conversation evaluates only what is new). docs/generate.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GGToolError, human_bytes
from .chat import ChatTemplate, ChatTemplateError, model_template
from .programs import shipped_program
from .sampling import LogitsError, SamplerChain, Sampling, log_probs
from .text import TextStream

END_EOS, END_STOP, END_LENGTH, END_CONTEXT = "eos", "stop", "length", "context-full"
CONVERSATION_CTX = 4096   # a conversation's KV cache when none is asked (llama.cpp's default n_ctx)


class PromptError(GGToolError):
    """A prompt that cannot be generated from: empty, or longer than the KV cache."""

    def __init__(self, message: str, kind: str, n_prompt: int = 0, n_ctx: int = 0):
        self.kind, self.n_prompt, self.n_ctx = kind, n_prompt, n_ctx
        super().__init__(message)


@dataclass
class Note:
    """Something the caller should tell the user before the work starts (`kind`: over-trained, ...)."""

    kind: str
    message: str
    details: dict = field(default_factory=dict)


@dataclass
class Step:
    """One generated token: its id, its bytes (llama_token_to_piece; control tokens empty), the text
    this token releases (stop strings held back), with `logprobs` its log-probability and the most
    likely alternatives; on the last step `end` (eos, stop, length, context-full) and `stop`."""

    token: int
    piece: bytes
    text: str
    logprob: float | None = None
    top: list = field(default_factory=list)
    end: str | None = None
    stop: str | None = None
    prompt_seconds: float = 0.0
    generate_seconds: float = 0.0


def open_model(path, program=None) -> Model:
    """The model at `path`, with `program` (a parsed DSL Program, or a path to one) or the program
    shipped for its architecture."""
    return Model(path, program)


class Model:
    """A GGUF model opened for generation (see the module's docstring)."""

    def __init__(self, path, program=None):
        from ..gguf_io import open_gguf
        from ..tokenizer import Vocab

        self.path = os.fspath(path)
        self.gguf = open_gguf(self.path)
        self.architecture = self.metadata("general.architecture", "") or ""
        self.program = self._program(program)
        self.vocab = Vocab.from_gguf(self.path)
        train = self.metadata(f"{self.architecture}.context_length")
        self.n_ctx_train = train if isinstance(train, int) and not isinstance(train, bool) and train > 0 else None
        suppress = self.metadata("tokenizer.ggml.suppress_tokens")
        self.suppress_ids = [int(t) for t in suppress if isinstance(t, int) and 0 <= t < self.vocab.n_tokens] \
            if isinstance(suppress, list) else []

    def metadata(self, key: str, default=None):
        return self.gguf.metadata(key, default)

    def _program(self, program):
        from ..dsl import parse

        if program is None:
            path = shipped_program(self.architecture, self.path)
            return parse(path.read_text(encoding="utf-8"), filename=str(path))
        if isinstance(program, (str, os.PathLike)):
            return parse(Path(program).read_text(encoding="utf-8"), filename=os.fspath(program))
        return program

    # -- policy --------------------------------------------------------------------------------------
    def context_size(self, requested: int | None, n_prompt: int, n_predict: int,
                     conversation: bool = False) -> tuple[int, list[Note]]:
        """The KV cache's cells: `requested`, or the prompt's tokens plus n_predict (a conversation:
        CONVERSATION_CTX, llama.cpp's default n_ctx), at most the trained context; a request beyond
        the trained context is kept, with a note (llama.cpp's "model was trained on only N context
        tokens")."""
        notes = []
        if requested is None:
            n_ctx = CONVERSATION_CTX if conversation else n_prompt + n_predict
            if self.n_ctx_train is not None:
                n_ctx = min(n_ctx, self.n_ctx_train)
            return max(n_ctx, 1), notes
        if self.n_ctx_train is not None and requested > self.n_ctx_train:
            notes.append(Note("over-trained", f"the model was trained on only {self.n_ctx_train} tokens of context "
                              f"(n_ctx {requested})", {"n_ctx": requested, "n_ctx_train": self.n_ctx_train}))
        return requested, notes

    def sampler(self, sampling: Sampling) -> SamplerChain:
        """The chain for `sampling`, with the model's general.sampling.* defaults where the caller
        gave none, -inf for its suppressed tokens (and its end-of-generation ones with ignore_eos)."""
        from .sampling import SamplingError

        for token, _ in sampling.logit_bias:
            if not 0 <= token < self.vocab.n_tokens:
                raise SamplingError("logit_bias", token, f"token {token} is outside the vocabulary "
                                    f"({self.vocab.n_tokens} tokens)")
        try:
            s = sampling.with_model_defaults(lambda k: self.metadata(k))
        except SamplingError as e:     # a default the model's metadata gives: the file is where
            raise SamplingError(f"{self.path}: {e.field}", e.value, e.reason) from None
        return s.chain(self.vocab.n_tokens, self.vocab.eog_ids, self.suppress_ids, self.vocab)

    def stop_ids(self, ignore_eos: bool = False) -> frozenset:
        """The tokens that end a generation (llama_vocab_is_eog), none with ignore_eos."""
        return frozenset() if ignore_eos else self.vocab.eog_ids

    def tokenize(self, text: str) -> list[int]:
        """A plain prompt's ids, as `ggtool tokenize` gives them (BOS as the model says)."""
        return self.vocab.tokenize(text)

    # -- chat ----------------------------------------------------------------------------------------
    def chat_template(self, text: str | None = None, source: str | None = None) -> ChatTemplate:
        """`text` (from `source`, a file), or the model's tokenizer.chat_template."""
        v = self.vocab
        bos = v.tokens[v.bos_id] if v.bos_id >= 0 else ""
        eos = v.tokens[v.eos_id] if v.eos_id >= 0 else ""
        if text is None:
            source = f"{self.path}: tokenizer.chat_template"
            text = model_template(lambda k: self.metadata(k), source)
            if text is None:
                raise ChatTemplateError(self.path, "the model has no chat template (tokenizer.chat_template)",
                                        "no-template")
        return ChatTemplate(text, source or "<chat template>", bos, eos)

    def chat_prompt(self, rendered: str) -> tuple[str, list[int]]:
        """A rendered chat prompt's text as the model sees it and its ids: special tokens' texts
        are those tokens, and BOS leads once, as the model asks (the template's own, or added)."""
        v = self.vocab
        ids = v.tokenize(rendered, add_special=False, parse_special=True)
        if v.add_bos and v.bos_id >= 0 and (not ids or ids[0] != v.bos_id):
            return v.tokens[v.bos_id] + rendered, [v.bos_id, *ids]
        return rendered, ids

    # -- running -------------------------------------------------------------------------------------
    def generator(self, n_ctx: int, threads: int | None = None, numerics: str = "ggml", steps: int = 1) -> Generator:
        return Generator(self, n_ctx, threads, numerics, steps)


class Generator:
    """One model, its KV cache of n_ctx cells and the threads each step runs on; `generate` runs a
    prompt on, keeping in the cache what a later prompt can reuse. `steps`: the one-token steps the
    caller expects to run, which the default thread count weighs against a pool's start."""

    def __init__(self, model: Model, n_ctx: int, threads: int | None = None, numerics: str = "ggml", steps: int = 1):
        from .session import Session

        self.model, self.n_ctx = model, n_ctx
        self.session = Session(model.path, model.program, n_ctx=n_ctx, numerics=numerics)
        self.session.prepare(1)
        self.n_logits = self.session.logits_width()
        if self.n_logits != model.vocab.n_tokens:
            raise LogitsError(f"{model.path}: the model computes {self.n_logits} logits but its vocabulary has "
                              f"{model.vocab.n_tokens} tokens (tokenizer.ggml.tokens); llama.cpp refuses such a model")
        if threads is None:
            from ..plan import estimate_work
            from ..threads import default_threads

            threads = default_threads(estimate_work(self.session.graph(1)), steps=max(1, steps))
        self.n_threads = threads
        if threads > 1:
            from ..pool import get_pool

            self.session.attach_pool(threads, get_pool(threads))
        self.cached: list[int] = []        # the tokens whose K and V are in the cache, in order
        self.reused = 0                    # the last prompt's tokens found in the cache
        self.notes: list[Note] = []        # for the caller to show (e.g. numerics not covered)

    @property
    def cache_bytes(self) -> int:
        return self.session.state_bytes()

    def cache_note(self) -> Note:
        return Note("cache", f"the KV cache of {self.n_ctx} cells takes {human_bytes(self.cache_bytes)}",
                    {"bytes": self.cache_bytes})

    def generate(self, prompt: list[int], n_predict: int, chain: SamplerChain, stop_ids=frozenset(),
                 stops=(), logprobs: int = 0, clock=time.perf_counter) -> Iterator[Step]:
        """Each new token after `prompt` (its part already in the cache is not evaluated again):
        at most n_predict, none after an end-of-generation token (stop_ids) or a stop string, none
        once the cache is full. The chain accepts the prompt's tokens first."""
        if not prompt:
            raise PromptError("the prompt has no tokens", "empty")
        if len(prompt) > self.n_ctx:
            raise PromptError(f"the prompt has {len(prompt)} tokens, more than the KV cache's {self.n_ctx}",
                              "too-long", len(prompt), self.n_ctx)
        keep = 0
        for a, b in zip(self.cached, prompt[:-1]):   # the cache's common start, the last token evaluated again
            if a != b:
                break
            keep += 1
        for t in prompt[keep:]:                       # what the chain has not seen (all, the first time)
            chain.accept(t)
        text = TextStream(stops)
        if n_predict <= 0:
            return
        s = self.session
        s.n_past = keep
        self.cached, self.reused = self.cached[:keep], keep
        room = self.n_ctx - len(prompt) + 1       # the last token is sampled, never evaluated
        limit = min(n_predict, room)
        from ..compiling.first_run import repeating
        from .loop import ahead

        later = ahead(s, limit)         # a first-ever run's kernels for the steps: compiling from now on
        with repeating(limit, later) as steps:  # a kernel not compiled yet: its twin's cost counts once a step to come
            yield from self._steps(prompt, keep, limit, room, n_predict, chain, stop_ids, text, logprobs, clock, steps)

    def _steps(self, prompt, keep, limit, room, n_predict, chain, stop_ids, text, logprobs, clock, steps):
        s = self.session
        t0 = clock()
        logits = s.eval(prompt[keep:])
        self.cached += prompt[keep:]
        prompt_seconds = clock() - t0
        t1 = clock()
        vocab = self.model.vocab
        for i in range(limit):
            token = chain.sample(logits)
            lp, top = (log_probs(logits, token, logprobs) if logprobs else (None, []))
            piece = vocab.token_to_piece(token)
            released = text.feed(piece)
            end = None
            if text.stopped is not None:
                end = END_STOP
            elif token in stop_ids:
                end = END_EOS
            elif i + 1 == limit:
                end = END_LENGTH if n_predict <= room else END_CONTEXT
            if end is not None and end != END_STOP:
                released += text.finish()
            yield Step(token, piece, released, lp, top, end, text.stopped, prompt_seconds, clock() - t1)
            if end is not None:
                return
            steps.next(limit - 1 - i)
            logits = s.eval([token])
            self.cached.append(token)
