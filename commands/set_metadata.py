"""`ggtool set-metadata INPUT -o OUTPUT`: a GGUF file with metadata set, added or deleted, into a new file."""

from __future__ import annotations

import click

from ggtool.gguf_io import GGUFFile
from ggtool.gguf_io import edit as E
from ggtool.gguf_io.format import cut_text, quote_text
from ggtool.gguf_io.write import check_output_paths
from ggtool.tensor_io import atomic_path, named_write_errors

from ._common import log

HELP = """Write a copy of a GGUF file with metadata key/values set, added or deleted.

As gguf-py's gguf-new-metadata, into a NEW file (-o): every other key/value is copied as it
is, in its place, and the tensors are copied byte for byte at the same offsets. The output is
written to a temporary file beside OUTPUT, read back, and moved into place at the end, so an
error or Ctrl-C leaves no partial file; an existing OUTPUT needs --force (without it, of several
runs writing the same new OUTPUT at once one succeeds, the others say it exists), and OUTPUT may
not be INPUT.

\b
New keys go last, each in the order given:
  those of --set, then of --set-typed, then of --set-file.

\b
  --set KEY=VALUE           VALUE as KEY's own type (a new KEY: a string)
  --set-typed KEY=TYPE:VALUE  TYPE as llama-quantize's KEY=TYPE:VALUE spells it:
                            int (KEY's integer type, else UINT32), float (KEY's,
                            else FLOAT32), bool (true/false), str; or GGUF's own:
                            u8 i8 u16 i16 u32 i32 u64 i64 f32 f64 (uint32, ...)
  --set-file KEY=FILE       a string read from FILE: a regular UTF-8 file of at
                            most 64 MiB (a chat template, a tokenizer's JSON)
  --delete KEY              remove KEY (it must be there)
Values are checked against their type: 300 does not fit a UINT8, 'abc' is not an integer,
f32:1e-50 would be stored as 0 and f32:1e-40 would lose digits (both refused), f32:3.4028235e38
(FLT_MAX) is kept, inf and NaN are refused; keys and strings must be UTF-8. Each key may be
edited once.

\b
Refused, because the file would be corrupt or lie:
  - general.alignment other than a UINT32 power of two up to 65536 (a new alignment is
    honoured: the tensors are laid out again for it, their bytes unchanged)
  - deleting general.architecture or making it other than a string (llama.cpp needs it)
  - split.no, split.count, split.tensors.count, and a split model (edit a single file)
  - an array set to a scalar (delete it instead)
  - an empty key, and a key that is not UTF-8 (gguf-py could not open the file)
quantize refuses the same metadata overrides, in the same words.

\b
Examples:
  $ ggtool set-metadata model.gguf -o renamed.gguf --set general.name='My model'
  $ ggtool set-metadata model.gguf -o out.gguf --set-typed llama.context_length=int:4096
  $ ggtool set-metadata model.gguf -o out.gguf --set-file tokenizer.chat_template=chat.jinja
  $ ggtool set-metadata model.gguf -o out.gguf --delete general.url --force
  $ ggtool inspect out.gguf                          # what it holds now
"""


def _split_pair(value: str, what: str) -> tuple[str, str]:
    key, eq, rest = value.partition("=")
    if not eq or not key:
        raise click.BadParameter(f"{value!r} is not {what}")
    return key, rest


def _sets(ctx, param, values):
    return [E.SetValue(*_split_pair(v, "KEY=VALUE")) for v in values]


def _typed_sets(ctx, param, values):
    out = []
    for v in values:
        key, rest = _split_pair(v, "KEY=TYPE:VALUE")
        vtype, colon, text = rest.partition(":")
        if not colon or not vtype:
            raise click.BadParameter(f"{v!r} is not KEY=TYPE:VALUE (e.g. llama.context_length=int:4096)")
        out.append(E.SetValue(key, text, vtype))
    return out


def _file_sets(ctx, param, values):
    return [_split_pair(v, "KEY=FILE") for v in values]


@click.command("set-metadata", help=HELP, short_help="Copy a GGUF file with metadata set, added or deleted.")
@click.argument("input_path", metavar="INPUT", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--out", "output_path", required=True, type=click.Path(dir_okay=False), metavar="OUTPUT",
              help="The GGUF file to write (a new file, unless --force).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", callback=_sets,
              help="Set KEY to VALUE, parsed as KEY's own type (a new KEY: a string). Repeatable.")
@click.option("--set-typed", "typed", multiple=True, metavar="KEY=TYPE:VALUE", callback=_typed_sets,
              help="Set KEY to VALUE of TYPE (int float bool str u8 .. i64 f32 f64). Repeatable.")
@click.option("--set-file", "files", multiple=True, metavar="KEY=FILE", callback=_file_sets,
              help="Set KEY to the text of FILE (a regular UTF-8 file, at most 64 MiB), a string. Repeatable.")
@click.option("--delete", "deletes", multiple=True, metavar="KEY", help="Remove KEY. Repeatable.")
@click.option("--force", is_flag=True, help="Overwrite an existing OUTPUT.")
@click.option("--quiet", "-q", is_flag=True, help="No line per edit, no summary.")
def command(input_path, output_path, sets, typed, files, deletes, force, quiet):
    if not sets and not typed and not files and not deletes:
        raise click.UsageError("nothing to do: give --set, --set-typed, --set-file or --delete")
    g = GGUFFile(input_path)
    edits = [*sets, *typed, *(E.SetValue(key, E.read_value_file(key, path), "str") for key, path in files)]
    plan = E.plan_edit(g, edits, deletes)
    check_output_paths(g.paths, output_path, force)   # an existing OUTPUT: wording.py adds --force
    # replace=force: without --force the file is put in place only if OUTPUT is still new then
    with atomic_path(output_path, replace=force) as tmp, named_write_errors(output_path):
        with open(tmp, "wb", buffering=0) as f:
            size = E.write_edited(plan, f)
        if tmp != output_path:        # a FIFO or a device: nothing to read back
            E.check_written(plan, tmp)
    if not quiet:
        for key in plan.changed + plan.added:
            what = "set" if key in plan.changed else "added"
            log(f"{what} {key} = {_shown(*plan.values[key])}")
        for key in plan.deleted:
            log(f"deleted {key}")
        log(f"wrote {output_path} ({size:,} bytes)")


def _shown(vtype: int, value) -> str:
    """A value as inspect shows it, with its GGUF type (a long string cut, with its length)."""
    if isinstance(value, str) and len(value) > 80:
        head, n = cut_text(value, 60)
        return f"{quote_text(head)}... ({n:,} characters) ({E.type_name(vtype)})"
    text = quote_text(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else f"{value:g}" \
        if isinstance(value, float) else str(value)
    return f"{text} ({E.type_name(vtype)})"
