"""`ggtool set-metadata INPUT -o OUTPUT`: a GGUF file with metadata set, added or deleted, into a new file."""

from __future__ import annotations

import click

from ggtool.gguf_io import GGUFFile
from ggtool.gguf_io import edit as E
from ggtool.gguf_io.format import quote_text
from ggtool.gguf_io.write import check_output_paths
from ggtool.tensor_io import atomic_path, named_write_errors

from ._common import log

HELP = """Write a copy of a GGUF file with metadata key/values set, added or deleted.

As gguf-py's gguf-new-metadata, into a NEW file (-o): every other key/value is copied as it
is, in its place, and the tensors are copied byte for byte at the same offsets. The output is
written to a temporary file beside OUTPUT and renamed at the end, so an error or Ctrl-C leaves
no partial file; an existing OUTPUT needs --force, and OUTPUT may not be INPUT.

\b
New keys go last, each in the order given:
  those of --set, then of --set-typed, then of --set-file.

\b
  --set KEY=VALUE           VALUE as KEY's own type (a new KEY: a string)
  --set-typed KEY=TYPE:VALUE  TYPE as llama-quantize's KEY=TYPE:VALUE spells it:
                            int (KEY's integer type, else UINT32), float (KEY's,
                            else FLOAT32), bool (true/false), str; or GGUF's own:
                            u8 i8 u16 i16 u32 i32 u64 i64 f32 f64 (uint32, ...)
  --set-file KEY=FILE       a string read from a UTF-8 FILE (a chat template)
  --delete KEY              remove KEY (it must be there)
Values are checked against their type: 300 does not fit a UINT8, 'abc' is not an integer,
inf and NaN are refused. Each key may be edited once.

\b
Refused, because the file would be corrupt or lie:
  - general.alignment other than a UINT32 power of two up to 65536 (a new alignment is
    honoured: the tensors are laid out again for it, their bytes unchanged)
  - deleting general.architecture or making it other than a string (llama.cpp needs it)
  - split.no, split.count, split.tensors.count, and a split model (edit a single file)
  - an array set to a scalar (delete it instead)

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
    out = []
    for v in values:
        key, path = _split_pair(v, "KEY=FILE")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise click.BadParameter(f"{path}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise click.BadParameter(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
        out.append(E.SetValue(key, text, "str"))
    return out


@click.command("set-metadata", help=HELP, short_help="Copy a GGUF file with metadata set, added or deleted.")
@click.argument("input_path", metavar="INPUT", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--out", "output_path", required=True, type=click.Path(dir_okay=False), metavar="OUTPUT",
              help="The GGUF file to write (a new file, unless --force).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", callback=_sets,
              help="Set KEY to VALUE, parsed as KEY's own type (a new KEY: a string). Repeatable.")
@click.option("--set-typed", "typed", multiple=True, metavar="KEY=TYPE:VALUE", callback=_typed_sets,
              help="Set KEY to VALUE of TYPE (int float bool str u8 .. i64 f32 f64). Repeatable.")
@click.option("--set-file", "files", multiple=True, metavar="KEY=FILE", callback=_file_sets,
              help="Set KEY to the text of FILE (UTF-8), a string. Repeatable.")
@click.option("--delete", "deletes", multiple=True, metavar="KEY", help="Remove KEY. Repeatable.")
@click.option("--force", is_flag=True, help="Overwrite an existing OUTPUT.")
@click.option("--quiet", "-q", is_flag=True, help="No line per edit, no summary.")
def command(input_path, output_path, sets, typed, files, deletes, force, quiet):
    edits = [*sets, *typed, *files]
    if not edits and not deletes:
        raise click.UsageError("nothing to do: give --set, --set-typed, --set-file or --delete")
    g = GGUFFile(input_path)
    plan = E.plan_edit(g, edits, deletes)
    check_output_paths(g.paths, output_path, force)   # an existing OUTPUT: wording.py adds --force
    with atomic_path(output_path) as tmp, open(tmp, "wb", buffering=0) as f, named_write_errors(output_path):
        size = E.write_edited(plan, f)
    if not quiet:
        for key in plan.changed + plan.added:
            what = "set" if key in plan.changed else "added"
            log(f"{what} {key} = {_shown(*plan.values[key])}")
        for key in plan.deleted:
            log(f"deleted {key}")
        log(f"wrote {output_path} ({size:,} bytes)")


def _shown(vtype: int, value) -> str:
    """A value as inspect shows it, with its GGUF type."""
    text = quote_text(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else f"{value:g}" \
        if isinstance(value, float) else str(value)
    return f"{text} ({E.type_name(vtype)})"
