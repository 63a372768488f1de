"""Generated tokens as text: UTF-8 decoded as the bytes come (a character split across tokens waits
for its last byte), and stop strings: the text before the first one is released, never a part of
one: text that could still become a stop string is held back until it cannot."""

from __future__ import annotations

import codecs


class TextStream:
    """Feed each token's bytes (`feed`), get the text safe to write now; `stopped` is the stop
    string found (None while none is); `finish()` releases what is held at the end."""

    def __init__(self, stops=()):
        self.stops = [s for s in stops if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._held = ""
        self.stopped: str | None = None
        self.text = ""          # everything released so far

    def feed(self, piece: bytes) -> str:
        if self.stopped is not None:
            return ""
        return self._push(self._decoder.decode(piece))

    def finish(self) -> str:
        """At the end of a generation: what is held (no more tokens can complete a stop string)."""
        if self.stopped is not None:
            return ""
        out = self._push(self._decoder.decode(b"", final=True))
        if self.stopped is None:
            out, self.text, self._held = out + self._held, self.text + self._held, ""
        return out

    def _push(self, new: str) -> str:
        buf = self._held + new
        if not self.stops:
            self._held = ""
            self.text += buf
            return buf
        first = None
        for s in self.stops:
            at = buf.find(s)
            if at >= 0 and (first is None or at < first[0]):
                first = (at, s)
        if first is not None:
            self.stopped = first[1]
            self._held = ""
            out = buf[:first[0]]
            self.text += out
            return out
        hold = 0
        for s in self.stops:   # the longest end of buf that begins a stop string
            for k in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:k]):
                    hold = k
                    break
        out, self._held = (buf[:-hold], buf[-hold:]) if hold else (buf, "")
        self.text += out
        return out
