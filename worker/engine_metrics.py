"""Prometheus series of the answer engine (`worker.engine`), on the default registry: the
service's `/metrics` exports them in the embedded form; a Celery worker process exports its
own when `CONDUIT_WORKER_METRICS_PORT` is set.

The series say where a question's time goes: waiting for an answer slot, each phase of its
prefill (page KV assembled, tokens chosen, refreshed up to the first token's logits), and the
batched decode steps it shares with the others; with the batch's size, the queue's length and
the questions whose client went away.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

BATCH_SIZE = Histogram("conduit_engine_batch_size", "Answers advanced by one batched decode "
                       "step", buckets=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256))
QUEUE_LENGTH = Gauge("conduit_engine_queue_length", "Questions waiting for an answer slot")
QUEUE_SECONDS = Histogram("conduit_engine_queue_seconds", "Time a question waited for an "
                          "answer slot", buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                                                  10, 30, 60))
ACTIVE = Gauge("conduit_engine_active_answers", "Answers in the running batch")
CANCELLED = Counter("conduit_engine_cancelled_total", "Questions that left the engine because "
                    "their client went away (in the queue or mid-answer)")
STEP_SECONDS = Histogram("conduit_engine_step_seconds", "Wall time of one batched decode "
                         "step", buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                          0.5, 1, 2.5))
PREFILL_PHASES = ("assembled", "chosen", "refreshed")  # the runtime yields the first two
GROUP_PHASES = ("scoring", "refresh")  # yielded after each layer group but a pass's last
PHASE_SECONDS = Histogram("conduit_engine_prefill_phase_seconds", "Wall time of one prefill "
                          "phase of a question (assembled, scoring, chosen, refresh, "
                          "refreshed)", ["phase"],
                          buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
                                   5, 10))
