"""The sweep's chart: mean KL divergence against file size, the Pareto front marked, as SVG text and
as a PNG written here (zlib and struct, a 5x7 bitmap font: no plotting library).

`pareto_front(points)` gives the indices of the points no other point beats on both axes (as
small or smaller in size and in KLD, and smaller in one), by increasing size. `Chart(points,
front)` draws (x, y, label) points: y on a log scale where every y is positive and they span more
than a decade, else linear.
"""

from __future__ import annotations

import math
import struct
import zlib
from xml.sax.saxutils import escape

# 5x7 glyphs, one int per row (bit 4 the leftmost column): what the PNG's labels need
_FONT = {
    "0": (0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E), "1": (0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E),
    "2": (0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F), "3": (0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E),
    "4": (0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02), "5": (0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E),
    "6": (0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E), "7": (0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08),
    "8": (0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E), "9": (0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C),
    "A": (0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11), "B": (0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E),
    "C": (0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E), "D": (0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C),
    "E": (0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F), "F": (0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10),
    "G": (0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F), "H": (0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11),
    "I": (0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E), "J": (0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C),
    "K": (0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11), "L": (0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F),
    "M": (0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11), "N": (0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11),
    "O": (0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E), "P": (0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10),
    "Q": (0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D), "R": (0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11),
    "S": (0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E), "T": (0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04),
    "U": (0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E), "V": (0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04),
    "W": (0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A), "X": (0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11),
    "Y": (0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04), "Z": (0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F),
    " ": (0,) * 7, ".": (0, 0, 0, 0, 0, 0x0C, 0x0C), "_": (0, 0, 0, 0, 0, 0, 0x1F), "-": (0, 0, 0, 0x1F, 0, 0, 0),
    "(": (0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02), ")": (0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08),
    ":": (0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0), "/": (0, 0x01, 0x02, 0x04, 0x08, 0x10, 0),
    "%": (0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03), ",": (0, 0, 0, 0, 0x0C, 0x04, 0x08),
    "+": (0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0),
}
_UNKNOWN = (0x1F, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1F)

WIDTH, HEIGHT = 800, 520
LEFT, RIGHT, TOP, BOTTOM = 90, 30, 50, 70
GREY, BLACK, WHITE, RED, BLUE, LIGHT = (150, 150, 150), (0, 0, 0), (255, 255, 255), (200, 30, 30), (40, 80, 190), (225, 225, 225)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points that no other point dominates (x <= and y <=, one of them <), by x."""
    front = []
    for i, (x, y) in enumerate(points):
        if not all(math.isfinite(v) for v in (x, y)):
            continue
        if not any(j != i and xj <= x and yj <= y and (xj < x or yj < y)
                   for j, (xj, yj) in enumerate(points) if math.isfinite(xj) and math.isfinite(yj)):
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], points[i][1]))


def _nice_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    return [start + k * step for k in range(int((hi - start) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 1e-3:
        return f"{v:.0e}".replace("e-0", "e-").replace("e+0", "e+")
    return f"{v:.4g}"


class Chart:
    """Points (x, y, label), the indices on the front, titles; `svg()` and `png()`."""

    def __init__(self, points: list[tuple[float, float, str]], front: list[int], *, title: str, x_label: str,
                 y_label: str):
        self.points = [(float(x), float(y), str(label)) for x, y, label in points
                       if math.isfinite(float(x)) and math.isfinite(float(y))]
        self.front = [i for i in front if i < len(points)]
        self.title, self.x_label, self.y_label = title, x_label, y_label
        # points at the same place share one label ("Q2_K/Q4_0": a fallback can make two types one file)
        self.labels = [label for _, _, label in self.points]
        for i, (x, y, _) in enumerate(self.points):
            first = next(j for j, (xj, yj, _) in enumerate(self.points) if (xj, yj) == (x, y))
            if first != i:
                self.labels[first] += "/" + self.labels[i]
                self.labels[i] = ""
        ys = [y for _, y, _ in self.points]
        self.log_y = bool(ys) and min(ys) > 0 and max(ys) / min(ys) > 10
        xs = [x for x, _, _ in self.points] or [0.0, 1.0]
        pad = (max(xs) - min(xs)) * 0.08 or max(abs(xs[0]) * 0.1, 1.0)
        self.x0, self.x1 = min(xs) - pad, max(xs) + pad
        if self.log_y:
            self.y0, self.y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
            if self.y0 == self.y1:
                self.y1 += 1
        else:
            ys = ys or [0.0, 1.0]
            pad = (max(ys) - min(ys)) * 0.08 or max(abs(ys[0]) * 0.1, 1e-6)
            self.y0, self.y1 = min(ys) - pad, max(ys) + pad

    # -- coordinates ----------------------------------------------------------------------------------
    def _px(self, x: float) -> float:
        return LEFT + (x - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)

    def _py(self, y: float) -> float:
        v = math.log10(y) if self.log_y else y
        return HEIGHT - BOTTOM - (v - self.y0) / (self.y1 - self.y0) * (HEIGHT - TOP - BOTTOM)

    def _x_ticks(self) -> list[float]:
        return [t for t in _nice_ticks(self.x0, self.x1) if self.x0 <= t <= self.x1]

    def _y_ticks(self) -> list[float]:
        if self.log_y:
            return [10.0 ** k for k in range(int(self.y0), int(self.y1) + 1)]
        return [t for t in _nice_ticks(self.y0, self.y1) if self.y0 <= t <= self.y1]

    def _front_xy(self) -> list[tuple[float, float]]:
        return [(self._px(self.points[i][0]), self._py(self.points[i][1])) for i in self.front]

    # -- SVG --------------------------------------------------------------------------------------------
    def svg(self) -> str:
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
               f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
               f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
               f'<text x="{WIDTH / 2}" y="28" text-anchor="middle" font-size="15">{escape(self.title)}</text>']
        l, r, t, b = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
        for v in self._x_ticks():
            x = self._px(v)
            out.append(f'<line x1="{x:.1f}" y1="{t}" x2="{x:.1f}" y2="{b}" stroke="#e1e1e1"/>')
            out.append(f'<text x="{x:.1f}" y="{b + 18}" text-anchor="middle">{_fmt(v)}</text>')
        for v in self._y_ticks():
            y = self._py(v)
            out.append(f'<line x1="{l}" y1="{y:.1f}" x2="{r}" y2="{y:.1f}" stroke="#e1e1e1"/>')
            out.append(f'<text x="{l - 8}" y="{y + 4:.1f}" text-anchor="end">{_fmt(v)}</text>')
        out.append(f'<rect x="{l}" y="{t}" width="{r - l}" height="{b - t}" fill="none" stroke="black"/>')
        out.append(f'<text x="{(l + r) / 2}" y="{HEIGHT - 25}" text-anchor="middle">{escape(self.x_label)}</text>')
        scale = " (log scale)" if self.log_y else ""
        out.append(f'<text transform="translate(22 {(t + b) / 2}) rotate(-90)" text-anchor="middle">'
                   f'{escape(self.y_label + scale)}</text>')
        fxy = self._front_xy()
        if len(fxy) > 1:
            pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in fxy)
            out.append(f'<polyline points="{pts}" fill="none" stroke="#c81e1e" stroke-width="2"/>')
        for i, (x, y, label) in enumerate(self.points):
            on = i in self.front
            px, py = self._px(x), self._py(y)
            out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="{5 if on else 4}" fill="{"#c81e1e" if on else "#2850be"}">'
                       f'<title>{escape(label)}: {x:.3f} MiB, KLD {y:.6g}{" (Pareto front)" if on else ""}</title></circle>')
            if self.labels[i]:
                out.append(f'<text x="{px + 7:.1f}" y="{py - 7:.1f}">{escape(self.labels[i])}</text>')
        out.append(f'<text x="{r - 4}" y="{t + 16}" text-anchor="end" fill="#c81e1e">— Pareto front</text>')
        out.append("</svg>\n")
        return "\n".join(out)

    # -- PNG --------------------------------------------------------------------------------------------
    def png(self) -> bytes:
        c = _Canvas(WIDTH, HEIGHT)
        l, r, t, b = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
        for v in self._x_ticks():
            x = round(self._px(v))
            c.line(x, t, x, b, LIGHT)
            s = _fmt(v)
            c.text(x - len(s) * 6, b + 10, s, BLACK, 2)
        for v in self._y_ticks():
            y = round(self._py(v))
            c.line(l, y, r, y, LIGHT)
            s = _fmt(v).upper()
            c.text(l - 8 - len(s) * 12, y - 7, s, BLACK, 2)
        c.rect(l, t, r, b, BLACK)
        c.text((l + r) // 2 - len(self.x_label) * 6, HEIGHT - 32, self.x_label.upper(), BLACK, 2)
        c.text(8, 8, (self.y_label + (" (log)" if self.log_y else "")).upper(), BLACK, 2)
        c.text(l, 28, self.title.upper()[:60], BLACK, 2)
        fxy = self._front_xy()
        for (x0, y0), (x1, y1) in zip(fxy, fxy[1:]):
            c.line(round(x0), round(y0), round(x1), round(y1), RED, 2)
        for i, (x, y, label) in enumerate(self.points):
            on = i in self.front
            px, py = round(self._px(x)), round(self._py(y))
            c.disc(px, py, 5 if on else 4, RED if on else BLUE)
            c.text(px + 7, py - 16, self.labels[i], RED if on else BLACK, 2)
        c.line(r - 150, t + 14, r - 130, t + 14, RED, 2)
        c.text(r - 124, t + 8, "PARETO FRONT", RED, 2)
        return c.png()


class _Canvas:
    """RGB pixels and the few shapes the chart draws."""

    def __init__(self, w: int, h: int):
        self.w, self.h = w, h
        self.px = bytearray(b"\xff" * (w * h * 3))

    def set(self, x: int, y: int, rgb) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i:i + 3] = bytes(rgb)

    def line(self, x0: int, y0: int, x1: int, y1: int, rgb, width: int = 1) -> None:
        n = max(abs(x1 - x0), abs(y1 - y0), 1)
        for k in range(n + 1):
            x = x0 + (x1 - x0) * k / n
            y = y0 + (y1 - y0) * k / n
            for dx in range(width):
                for dy in range(width):
                    self.set(round(x) + dx - width // 2, round(y) + dy - width // 2, rgb)

    def rect(self, x0: int, y0: int, x1: int, y1: int, rgb) -> None:
        for a, b2, c, d in ((x0, y0, x1, y0), (x0, y1, x1, y1), (x0, y0, x0, y1), (x1, y0, x1, y1)):
            self.line(a, b2, c, d, rgb)

    def disc(self, cx: int, cy: int, r: int, rgb) -> None:
        for y in range(-r, r + 1):
            for x in range(-r, r + 1):
                if x * x + y * y <= r * r:
                    self.set(cx + x, cy + y, rgb)

    def text(self, x: int, y: int, s: str, rgb, scale: int = 1) -> None:
        for k, ch in enumerate(s.upper()):
            rows = _FONT.get(ch, _UNKNOWN)
            for ry, bits in enumerate(rows):
                for rx in range(5):
                    if bits >> (4 - rx) & 1:
                        for dx in range(scale):
                            for dy in range(scale):
                                self.set(x + (k * 6 + rx) * scale + dx, y + ry * scale + dy, rgb)

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3]) for y in range(self.h))

        def chunk(tag: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
