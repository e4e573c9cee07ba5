"""A fixed 5 x 7 bitmap font drawn on the vision patch grid.

Each glyph fills one cell of `CELL` x `CELL` pixels (28 = Qwen2-VL's 14-pixel patch times its
2 x 2 merge), so one character is exactly one visual token. Font pixels are `SCALE` x `SCALE`
squares at integer offsets: the same picture whether drawn here with numpy or rendered from the
vector PDF the generator writes.

Public API:
  CELL, SCALE, X0, Y0          cell side, font pixel size, glyph offset inside its cell (pixels)
  ALPHABET                     the drawable characters; " " is a blank cell
  bitmap(ch) -> list[str]      seven rows of five "#"/"." characters
  draw_grid(rows) -> np.ndarray (H, W, 3) uint8: white page, black glyphs
"""

from __future__ import annotations

import numpy as np

CELL = 28
SCALE = 3
X0 = 6  # (28 - 5 * 3) // 2, rounded down
Y0 = 3  # (28 - 7 * 3) // 2

_FONT = {
    "A": ".###.#...##...#######...##...##...#", "B": "####.#...#####.#...##...##...#####.",
    "C": ".###.#...##....#....#....#...#.###.", "D": "####.#...##...##...##...##...#####.",
    "E": "######....####.#....#....#....#####", "F": "######....####.#....#....#....#....",
    "G": ".###.#...##....#.####...##...#.####", "H": "#...##...#######...##...##...##...#",
    "I": ".###...#....#....#....#....#...###.", "J": "..###...#....#....#....#.#..#..##..",
    "K": "#...##..#.###..#.#..#..#.#...##...#", "L": "#....#....#....#....#....#....#####",
    "M": "#...###.###.#.##...##...##...##...#", "N": "#...###..##.#.##..###...##...##...#",
    "O": ".###.#...##...##...##...##...#.###.", "P": "####.#...##...#####.#....#....#....",
    "Q": ".###.#...##...##...##.#.##..#..##.#", "R": "####.#...##...#####.#.#..#..#.#...#",
    "S": ".#####.....###.....#....##...#.###.", "T": "#####..#....#....#....#....#....#..",
    "U": "#...##...##...##...##...##...#.###.", "V": "#...##...##...##...##...#.#.#...#..",
    "W": "#...##...##...##.#.##.#.##.#..#.#..", "X": "#...##...#.#.#...#...#.#.#...##...#",
    "Y": "#...##...#.#.#...#....#....#....#..", "Z": "#####....#...#...#...#...#....#####",
    "0": ".###.#...##..###.#.###..##...#.###.", "1": "..#...##....#....#....#....#...###.",
    "2": ".###.#...#....#...#...#...#...#####", "3": "#####...#...#.....#....##...#.###..",
    "4": "...#...##..#.#.#..#.#####...#....#.", "5": "######....####.....#....##...#.###.",
    "6": "..##..#...#....####.#...##...#.###.", "7": "#####....#...#...#...#....#....#...",
    "8": ".###.#...##...#.###.#...##...#.###.", "9": ".###.#...##...#.####....#...#..##..",
    "=": "..........#####.....#####..........", "+": ".......#....#..#####..#....#.......",
    "#": ".#.#..#.#.#####.#.#.#####.#.#..#.#.", " ": "." * 35,
}
ALPHABET = "".join(_FONT)


def bitmap(ch: str) -> list[str]:
    """The seven rows (top first) of five pixels of `ch`: "#" ink, "." paper."""
    bits = _FONT[ch]
    return [bits[r * 5:(r + 1) * 5] for r in range(7)]


def draw_grid(rows: list[str]) -> np.ndarray:
    """Draw equal-length text rows as an (H, W, 3) uint8 image, one glyph per cell."""
    n_rows, n_cols = len(rows), len(rows[0])
    img = np.full((n_rows * CELL, n_cols * CELL, 3), 255, dtype=np.uint8)
    for r, line in enumerate(rows):
        for c, ch in enumerate(line):
            for gy, bits in enumerate(bitmap(ch)):
                for gx, bit in enumerate(bits):
                    if bit == "#":
                        y = r * CELL + Y0 + gy * SCALE
                        x = c * CELL + X0 + gx * SCALE
                        img[y:y + SCALE, x:x + SCALE] = 0
    return img
