"""Text generation: a model's program run token after token over a KV cache (`ggtool generate`),
each token chosen as llama.cpp's sampler chain chooses it.

`open_model(path)` opens a model (vocabulary, program, policy: the KV cache's size, threads, the
chat prompt) and `Model.generator(n_ctx)` runs it (`Generator.generate` yields a `Step` per
token); `Sampling` holds llama.cpp's sampling parameters and makes the `SamplerChain`; `Session` is
the model and its KV cache underneath; `ChatTemplate` renders conversations. docs/generate.md.
"""

from __future__ import annotations

from .chat import ChatTemplate, ChatTemplateError, MessagesError, check_message, read_messages
from .loop import Event, generate
from .model import END_CONTEXT, END_EOS, END_LENGTH, END_STOP, Generator, Model, Note, PromptError, Step, open_model
from .programs import SHIPPED, NoProgramError, shipped_names, shipped_program
from .sampling import ORDER, RANDOM_SEED, LogitsError, SamplerChain, Sampling, SamplingError, log_probs, parse_logit_bias
from .session import ContextFullError, NoCacheError, Session
from .text import TextStream

__all__ = ["END_CONTEXT", "END_EOS", "END_LENGTH", "END_STOP", "ORDER", "RANDOM_SEED", "SHIPPED", "ChatTemplate",
           "ChatTemplateError", "ContextFullError", "Event", "Generator", "LogitsError", "MessagesError", "Model",
           "NoCacheError", "NoProgramError", "Note", "PromptError", "SamplerChain", "Sampling", "SamplingError",
           "Session", "Step", "TextStream", "check_message", "generate", "log_probs", "open_model",
           "parse_logit_bias", "read_messages", "shipped_names", "shipped_program"]
