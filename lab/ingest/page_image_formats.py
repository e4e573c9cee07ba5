"""How large a stored page image is in each format, how long it takes to encode, and what a
lossy one loses (PSNR against the render), for a text page and a page drawn over by noise.

The ingest stores every rendered page (the model's input at prefill, the thumbnails and page
images served) and OCR reads the PDF page itself, not this file, so only size, encode time and
fidelity decide the format (docs/DECISIONS.md, "Page images").

    python -m lab.ingest.page_image_formats --out lab/ingest/results/page_image_formats
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pymupdf
from PIL import Image

FORMATS: dict[str, dict[str, Any]] = {
    "png-1 (stored now)": {"format": "PNG", "compress_level": 1},
    "png-6": {"format": "PNG", "compress_level": 6},
    "webp-lossless": {"format": "WEBP", "lossless": True, "method": 0},
    "jpeg-90": {"format": "JPEG", "quality": 90},
    "webp-85": {"format": "WEBP", "quality": 85},
}


def _page(kind: str, dpi: int) -> Image.Image:
    doc = pymupdf.open()
    page = doc.new_page()
    if kind == "noise":  # issue 70's pages: one noise image over each
        noise = np.random.default_rng(0).integers(0, 256, (280, 200, 3), dtype=np.uint8)
        jpeg = io.BytesIO()
        Image.fromarray(noise).save(jpeg, format="JPEG", quality=75)
        page.insert_image(page.rect, stream=jpeg.getvalue())
    else:
        for i in range(40):
            page.insert_text((50, 40 + i * 19), f"Line {i}: the pressure valve of pump {i} is "
                             f"inspected every {i + 3} days.", fontsize=10)
    pix = page.get_pixmap(dpi=dpi)
    return Image.frombytes("RGB", (pix.width, pix.height), pix.samples)


def _psnr(image: Image.Image, data: bytes) -> float | None:
    back = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float64)
    mse = float(((back - np.asarray(image, dtype=np.float64)) ** 2).mean())
    return None if mse == 0 else round(10 * np.log10(255**2 / mse), 1)


def measure(dpi: int, rounds: int) -> dict[str, Any]:
    """Bytes, median encode ms and PSNR (None: lossless) per page kind and format."""
    out: dict[str, Any] = {}
    for kind in ("text", "noise"):
        image = _page(kind, dpi)
        rows = {}
        for name, options in FORMATS.items():
            seconds, data = [], b""
            for _ in range(rounds):
                buf = io.BytesIO()
                began = time.perf_counter()
                image.save(buf, **options)
                seconds.append(time.perf_counter() - began)
                data = buf.getvalue()
            rows[name] = {"bytes": len(data),
                          "encode_ms": round(1000 * statistics.median(seconds), 1),
                          "psnr_db": _psnr(image, data)}
        out[kind] = {"size": list(image.size), "formats": rows}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dpi", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write <out>.json and <out>.md")
    args = parser.parse_args()
    result = {"command": "python -m lab.ingest.page_image_formats --out "
                         "lab/ingest/results/page_image_formats",
              "dpi": args.dpi, "rounds": args.rounds, "python": platform.python_version(),
              "pages": measure(args.dpi, args.rounds)}
    lines = [f"# Page image formats ({args.dpi} dpi)", "", f"`{result['command']}`", "",
             "| page | format | bytes | encode ms | PSNR dB |", "|---|---|---:|---:|---:|"]
    for kind, page in result["pages"].items():
        for name, row in page["formats"].items():
            psnr = "lossless" if row["psnr_db"] is None else row["psnr_db"]
            lines.append(f"| {kind} | {name} | {row['bytes']:,} | {row['encode_ms']} | {psnr} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
