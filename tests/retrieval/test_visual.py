"""The visual retriever slot: MaxSim scoring, and a real ColQwen2 checkpoint loaded and run.

No ColPali weights exist offline, so the checkpoint is a tiny randomly initialised
ColQwen2 (built on the project's builtin tiny Qwen2-VL processor) saved to disk: the
scores mean nothing, but loading, page and query embedding, and the fusion of the third
ranking are the same code a real checkpoint goes through.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from worker.retrieval import Candidate, VisualRetriever, load_visual_retriever, search
from worker.retrieval.visual import late_interaction_scores


def test_late_interaction_is_sum_of_best_matches() -> None:
    query = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    page_a = np.array([[0.9, 0.1], [0.2, 0.3]], dtype=np.float32)
    page_b = np.array([[0.1, 0.8]], dtype=np.float32)
    scores = late_interaction_scores(query, [page_a, page_b, None])
    assert scores[0] == pytest.approx(0.9 + 0.3)
    assert scores[1] == pytest.approx(0.1 + 0.8)
    assert scores[2] == -np.inf


def test_no_visual_retriever_unless_configured() -> None:
    assert load_visual_retriever(None) is None
    assert load_visual_retriever("") is None


def test_unsupported_checkpoint_is_refused(tmp_path: Path) -> None:
    from transformers import BertConfig

    BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
               intermediate_size=8).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="not a supported visual retriever"):
        load_visual_retriever(tmp_path)


@pytest.fixture(scope="module")
def tiny_colqwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import ColQwen2Config, ColQwen2ForRetrieval, ColQwen2Processor

    from conduit_core.model.builtin_models import tiny_qwen2_vl

    vlm, processor = tiny_qwen2_vl()
    torch.manual_seed(0)
    model = ColQwen2ForRetrieval(ColQwen2Config(vlm_config=vlm.config, embedding_dim=16))
    folder = tmp_path_factory.mktemp("colqwen2")
    model.save_pretrained(folder)
    ColQwen2Processor(image_processor=processor.image_processor,
                      tokenizer=processor.tokenizer).save_pretrained(folder)
    return folder


def page_image(label: str, shade: int) -> Image.Image:
    image = Image.new("RGB", (224, 280), (shade, 255 - shade, 128))
    ImageDraw.Draw(image).text((20, 20), label, fill="black")
    return image


def test_colqwen2_checkpoint_embeds_pages_and_queries(tiny_colqwen2: Path) -> None:
    retriever = load_visual_retriever(tiny_colqwen2)
    assert isinstance(retriever, VisualRetriever)
    pages = retriever.embed_pages([page_image("one", 10), page_image("two", 200)])
    assert len(pages) == 2 and all(p.ndim == 2 and p.shape[1] == 16 for p in pages)
    assert all(np.allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-3) for p in pages)
    assert not np.allclose(pages[0], pages[1])
    query = retriever.embed_query("revenue table")
    assert query.ndim == 2 and query.shape[1] == 16
    assert np.allclose(retriever.embed_query("revenue table"), query)


def test_visual_ranking_is_fused_as_a_third_list(tiny_colqwen2: Path) -> None:
    retriever = load_visual_retriever(tiny_colqwen2)
    assert retriever is not None
    images = [page_image(f"page {i}", 40 * i) for i in range(4)]
    visual = retriever.embed_pages(images)
    candidates = [Candidate(f"p{i}", "", None, v) for i, v in enumerate(visual)]
    hits = search("quarterly revenue", candidates, top_k=4, dense_weight=0.0,
                  visual=retriever)
    expected = np.argsort(-late_interaction_scores(retriever.embed_query("quarterly revenue"),
                                                   visual), kind="stable")
    assert [h.key for h in hits] == [f"p{i}" for i in expected]
    assert [h.visual_rank for h in hits] == [1, 2, 3, 4]
    # with text on one page, BM25 and the visual list are fused
    candidates[int(expected[-1])] = Candidate(f"p{expected[-1]}", "quarterly revenue table",
                                              None, visual[int(expected[-1])])
    fused = search("quarterly revenue", candidates, top_k=4, dense_weight=0.0,
                   visual=retriever)
    assert fused[0].key == f"p{expected[-1]}"
    assert fused[0].bm25_rank == 1 and fused[0].visual_rank == 4
