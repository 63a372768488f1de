"""Make rendered.json: each chat template rendered over each conversation of conversations.json by
llama-cpp-python's Jinja2ChatFormatter (and transformers' render_jinja_template where it is
installed), with add_generation_prompt. The templates: SmolLM2's and Qwen2.5-Coder's
tokenizer.chat_template, read from their GGUF files and saved here, and gemma-3-it.jinja. Run:

    /work/bench-env/venv/bin/python tests/golden/chat/make.py SMOLLM2.gguf QWEN2.5-CODER.gguf GEMMA-3.gguf
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def model_chat(path: str):
    """(template, bos text, eos text) as llama-cpp-python's Llama reads them (vocab only)."""
    from llama_cpp import Llama

    llm = Llama(path, vocab_only=True, verbose=False)
    bos, eos = llm.token_bos(), llm.token_eos()
    text = lambda t: llm._model.token_get_text(t) if t != -1 else ""  # noqa: E731
    return llm.metadata.get("tokenizer.chat_template"), text(bos), text(eos)


def main() -> None:
    smollm2, qwen, gemma = sys.argv[1:4]
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    templates = {}
    for name, path in (("smollm2", smollm2), ("qwen2.5-coder", qwen)):
        text, bos, eos = model_chat(path)
        (HERE / f"{name}.jinja").write_text(text, encoding="utf-8")
        templates[name] = (text, bos, eos)
    _, bos, eos = model_chat(gemma)   # gemma-3-270m (not -it) has no template: gemma-3-it's, with its tokens
    templates["gemma-3-it"] = ((HERE / "gemma-3-it.jinja").read_text(encoding="utf-8"), bos, eos)
    conversations = json.loads((HERE / "conversations.json").read_text(encoding="utf-8"))
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:
        render_jinja_template = None
    out = {"made_by": "llama-cpp-python's Jinja2ChatFormatter; transformers' render_jinja_template where it agrees",
           "bos_eos": {}, "rendered": {}}
    for name, (text, bos, eos) in templates.items():
        out["bos_eos"][name] = [bos, eos]
        fmt = Jinja2ChatFormatter(template=text, eos_token=eos, bos_token=bos, add_generation_prompt=True)
        out["rendered"][name] = {}
        for case, messages in conversations.items():
            got = fmt(messages=messages).prompt
            if render_jinja_template is not None:
                tf = render_jinja_template([messages], chat_template=text, add_generation_prompt=True,
                                           bos_token=bos, eos_token=eos)
                tf = tf[0][0] if isinstance(tf, tuple) else tf
                tf = tf[0] if isinstance(tf, list) else tf
                assert tf == got, (name, case, tf, got)
                out["transformers"] = __import__("transformers").__version__
            out["rendered"][name][case] = got
    (HERE / "rendered.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
