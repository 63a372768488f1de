"""The DSL programs `ggtool generate` ships, one per architecture (ggtool.generate.programs.SHIPPED
names them): llama.gg, gemma3.gg, qwen2.gg, qwen3.gg, and transformer.gg, which they include.
Data only: installed with the package, read by path (DIR)."""

from pathlib import Path

DIR = Path(__file__).resolve().parent
