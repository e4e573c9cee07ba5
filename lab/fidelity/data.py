"""Synthetic multi-page document requests for the fidelity evaluation (deterministic).

Pages are rendered like document scans: a heading, paragraphs of pseudo-words, sometimes a
ruled table or a figure box, black on white at a few page sizes (the model's processor then
resizes them to its visual-token budget). Each request puts its pages under a system prefix
that the pages were NOT prefilled with (page prefill uses the canonical page context), with a
text label before each page, and asks one question.

Public API:
  render_page(seed, size=(448, 560)) -> PIL.Image
  FidelityCase(prefix, labels, images, question)
  make_cases(n, pages, seed) -> list[FidelityCase]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from PIL import Image, ImageDraw

PAGE_SIZES = [(448, 560), (560, 448), (448, 448), (392, 588)]
PREFIXES = [
    "You are a careful assistant for an insurance archive. Answer from the scanned pages only.",
    "The following pages come from a municipal budget report. Cite the page you use.",
    "You help auditors read supplier invoices and contracts. Be brief and exact.",
    "Read the laboratory notebook pages below and answer the researcher's question.",
    "These are pages of a shipping manifest; quantities and ports matter most.",
    "Summarise nothing; answer the question with a number or a short phrase.",
]
QUESTIONS = [
    "What is the total amount due on the invoice?",
    "Which port is listed as the final destination?",
    "On which page is the signature of the inspector?",
    "What was the measured temperature in the second trial?",
    "How many units were shipped in March?",
    "Who approved the revised budget line for roads?",
    "What is the policy number in the header?",
    "Which table lists the quarterly expenses?",
]
_SYLLABLES = ["ra", "to", "mi", "ke", "lu", "sa", "no", "ve", "di", "pa", "ti", "ro", "ga",
              "be", "fo", "an", "el", "or", "im", "us"]


def _word(gen: torch.Generator) -> str:
    n = int(torch.randint(1, 4, (), generator=gen))
    return "".join(_SYLLABLES[int(i)] for i in torch.randint(0, len(_SYLLABLES), (n,),
                                                              generator=gen))


def _line(gen: torch.Generator, width_chars: int) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < width_chars:
        words.append(_word(gen))
    return " ".join(words)[:width_chars]


def render_page(seed: int, size: tuple[int, int] = (448, 560)) -> Image.Image:
    """A deterministic document-like page: heading, text lines, maybe a table or figure."""
    gen = torch.Generator().manual_seed(seed)
    w, h = size
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    draw.text((24, 16), _line(gen, 24).upper(), fill="black")  # heading
    draw.line((24, 32, w - 24, 32), fill="black", width=2)
    y = 44
    kind = int(torch.randint(0, 3, (), generator=gen))  # 0 text, 1 table, 2 figure
    while y < h - 24:
        if kind == 1 and y > h // 3 and y < h // 3 + 12:
            rows, cols = 5, 4
            cw, rh = (w - 48) // cols, 18
            for r in range(rows + 1):
                draw.line((24, y + r * rh, 24 + cols * cw, y + r * rh), fill="black")
            for c in range(cols + 1):
                draw.line((24 + c * cw, y, 24 + c * cw, y + rows * rh), fill="black")
            for r in range(rows):
                for c in range(cols):
                    num = int(torch.randint(0, 10000, (), generator=gen))
                    draw.text((28 + c * cw, y + 3 + r * rh), str(num), fill="black")
            y += rows * rh + 12
        elif kind == 2 and y > h // 2 and y < h // 2 + 12:
            bh = h // 5
            draw.rectangle((w // 4, y, 3 * w // 4, y + bh), outline="black", width=2)
            pts = [(w // 4 + i * (w // 2) // 8,
                    y + bh - int(torch.randint(4, bh - 4, (), generator=gen))) for i in range(9)]
            draw.line(pts, fill="black", width=2)
            y += bh + 12
        draw.text((24, y), _line(gen, (w - 48) // 6), fill="black")
        y += 12 + (10 if int(torch.randint(0, 6, (), generator=gen)) == 0 else 0)
    return img


@dataclass(frozen=True)
class FidelityCase:
    """One multi-page request: the prefix is new to the pages' cached KV."""

    prefix: str
    labels: list[str]
    images: list[Image.Image]
    question: str


def make_cases(n: int, pages: int, seed: int) -> list[FidelityCase]:
    """`n` requests of `pages` distinct pages each; a pure function of the arguments."""
    cases = []
    for i in range(n):
        gen = torch.Generator().manual_seed(seed * 100_003 + i)
        images = [render_page(seed * 1_000_003 + i * 1009 + p,
                              PAGE_SIZES[int(torch.randint(0, len(PAGE_SIZES), (),
                                                           generator=gen))])
                  for p in range(pages)]
        prefix = PREFIXES[int(torch.randint(0, len(PREFIXES), (), generator=gen))]
        question = QUESTIONS[int(torch.randint(0, len(QUESTIONS), (), generator=gen))]
        labels = [f"Page {p + 1} of {pages}:" for p in range(pages)]
        cases.append(FidelityCase(prefix=prefix, labels=labels, images=images,
                                  question=question))
    return cases
