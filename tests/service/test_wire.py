"""The answer's JSON form (Celery results and Redis messages) keeps snippets and the cache
report: what the distributed form's API process serves is what the worker computed."""

from __future__ import annotations

import json
from dataclasses import fields

from worker.answer_job import Answer, Citation
from worker.page_cache import CacheReport
from worker.retrieval.snippet import Snippet
from worker.wire import answer_from_json, answer_to_json


def test_answer_round_trips_through_json_with_snippets_and_cache() -> None:
    snip = Snippet(text="the valve is inspected", spans=((4, 9), (13, 22)), clipped_left=True)
    numbers = {f.name: 0.25 for f in fields(Answer) if f.type in ("float", "int")}
    answer = Answer(**{
        **numbers, "answer": "every 14 days", "policy": "conduit",
        "citations": [Citation(document_id="doc_1", filename="a.pdf", page=2, score=0.5,
                               snippet=snip),
                      Citation(document_id="doc_1", filename="a.pdf", page=3, score=0.1,
                               attention=0.25)],
        "timings": {"ttft_s": 0.1},
        "cache": CacheReport(pages_from={"memory": 1, "redis": 0, "disk": 0},
                             pages_prefilled_now=1),
    })
    back = answer_from_json(json.loads(json.dumps(answer_to_json(answer))))
    assert back == answer
    assert back.citations[0].snippet is not None
    assert back.citations[0].snippet.spans == ((4, 9), (13, 22))
