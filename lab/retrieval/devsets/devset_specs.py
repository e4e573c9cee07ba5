"""Data model of the retrieval dev set and the shared text pools (filler and names).

Everything is generated from a seeded `random.Random`: the same seed gives the same set.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

PageKind = Literal["cover", "columns", "table", "scan", "slide", "slide_image"]
Style = Literal["lexical", "paraphrase"]


@dataclass
class PageSpec:
    """One page: a kind, a title, paragraphs (or bullets) and an optional table."""

    kind: PageKind
    title: str
    paragraphs: list[str] = field(default_factory=list)
    table: list[list[str]] | None = None


@dataclass
class DocSpec:
    """One PDF of the dev set."""

    filename: str
    family: str
    pages: list[PageSpec] = field(default_factory=list)
    landscape: bool = False


@dataclass
class QuestionSpec:
    """A question with its gold pages; `style` says whether it reuses the page's words."""

    question: str
    doc: str
    evidence_pages: list[int]
    style: Style
    page_kind: PageKind


def ask(rng: random.Random, doc: DocSpec, page: int, lexical: str, paraphrase: str,
        out: list[QuestionSpec]) -> None:
    """Add one question about 1-based `page` of `doc`, worded one way or the other at random."""
    style: Style = "paraphrase" if rng.random() < 0.5 else "lexical"
    text = paraphrase if style == "paraphrase" else lexical
    out.append(QuestionSpec(text, doc.filename, [page], style, doc.pages[page - 1].kind))


def filler(rng: random.Random, pool: list[str], n: int, **slots: str) -> list[str]:
    """`n` distinct sentences from `pool` with `{slot}`s filled.

    Besides the given slots, `{city}`, `{person}`, `{month}`, `{pct}` and `{num}` get fresh
    random values in every sentence: the same city names and figures then recur across
    documents, as lexical distractors for the questions' facts.
    """
    out = []
    for template in rng.sample(pool, min(n, len(pool))):
        values = {"city": rng.choice(CITIES), "person": rng.choice(PEOPLE),
                  "month": rng.choice(MONTHS), "pct": str(rng.randint(2, 30)),
                  "num": str(rng.randint(12, 900)), **slots}
        out.append(template.format(**values))
    return out


def plant(rng: random.Random, sentences: list[str], fact: str) -> None:
    """Insert `fact` at a random position after the first sentence of `sentences`."""
    sentences.insert(rng.randint(1, max(len(sentences) - 1, 1)), fact)


def paragraphs(sentences: list[str], per: int = 3) -> list[str]:
    """Group sentences into paragraphs of `per`."""
    return [" ".join(sentences[i:i + per]) for i in range(0, len(sentences), per)]


CITIES = ["Tromso", "Aarhus", "Porto", "Gdansk", "Lyon", "Rotterdam", "Tampere", "Graz",
          "Bilbao", "Ghent", "Malmo", "Cork", "Brno", "Turin", "Leipzig", "Valencia",
          "Utrecht", "Bergen", "Krakow", "Seville", "Nantes", "Linz", "Espoo", "Genoa"]
PEOPLE = ["Ingrid Solberg", "Marco Bellini", "Aisha Rahman", "Tomasz Nowak", "Claire Dubois",
          "Henrik Lund", "Priya Natarajan", "Jonas Becker", "Elena Petrova", "Samuel Okafor",
          "Lucia Fernandez", "Rafael Costa", "Mei Tanaka", "Oliver Grant", "Fatima Zahra",
          "Anders Holm", "Sofia Rossi", "Daniel Weiss", "Nora Lindqvist", "Kofi Mensah"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]

REPORT_FILLER = [
    "During the year {company} kept its focus on disciplined growth and cash generation.",
    "Demand in our core markets was resilient despite higher interest rates.",
    "We continued to invest in digital tools that make ordering simpler for customers.",
    "Our balance sheet remains strong and gives us room to invest through the cycle.",
    "Energy costs eased in the second half, which supported margins across segments.",
    "Capital expenditure stayed within the range we communicated to investors.",
    "The board thanks every colleague for their commitment during a demanding year.",
    "We simplified the organisation and reduced the number of management layers.",
    "Inflation in wages and materials was largely offset by pricing and productivity.",
    "Customer satisfaction scores improved in most of the regions where we operate.",
    "We expect the market to remain competitive and price sensitive next year.",
    "Safety is our first priority and the lost-time injury rate declined again.",
    "Working capital was managed tightly and inventory days came down.",
    "Our strategy rests on three pillars: customers, efficiency and sustainability.",
    "Revenue growth was broad based, with volume gains in most product lines.",
    "We completed the integration of last year's acquisitions ahead of plan.",
    "Operating profit benefited from lower logistics costs and a better product mix.",
    "The outlook for the coming year assumes stable demand and moderate inflation.",
    "We engage regularly with shareholders on strategy, remuneration and climate.",
    "Free cash flow funded both the dividend and continued investment.",
    "Sales in {city} grew by {pct}% as new customers joined our loyalty scheme.",
    "We closed a small warehouse in {city} and moved its volumes to larger sites.",
    "{person} joined the executive team in {month} to lead operations.",
    "The new plant in {city} produced its first batch in {month}, on budget.",
    "Employee engagement rose to {pct} points above the industry benchmark.",
    "In {month} we refinanced a bond of EUR {num} million at a lower coupon.",
    "About {num} suppliers signed our updated code of conduct.",
    "Water and energy use per tonne of output fell by {pct}% over five years.",
    "The distribution network now serves {num} stores from regional hubs.",
    "We trained {num} managers in {city} on the new planning system.",
    "Our logistics partners in {city} switched {pct}% of their trucks to biogas.",
    "Emissions from company cars fell after {num} electric vehicles were leased.",
    "The dividend policy targets a payout of about half of net income.",
    "Share buybacks were paused while we invested in new capacity.",
    "Our research centre in {city} filed {num} patent applications.",
    "Customers in {city} rated our delivery reliability at {pct}% above target.",
    "We divested a non-core business unit in {month} for EUR {num} million.",
    "Staff turnover fell to {pct}% thanks to better onboarding.",
    "The audit of our climate data was completed by an external firm in {month}.",
    "Headcount grew by {num} people, mostly in sales and engineering.",
]
MANUAL_FILLER = [
    "Read this manual completely before installing or operating the {machine}.",
    "Keep the manual near the machine so that every operator can consult it.",
    "Only trained and authorised personnel may carry out maintenance work.",
    "Disconnect the power supply and lock it out before opening any cover.",
    "Wear safety glasses, gloves and hearing protection when working nearby.",
    "Do not remove or bypass guards, interlocks or warning labels.",
    "Report any damage or unusual noise to your supervisor immediately.",
    "Use only original spare parts supplied by the manufacturer.",
    "Clean the machine regularly and keep the work area free of obstacles.",
    "Check all connections for tightness after the first hours of operation.",
    "The operator must stay at the control panel while the machine is running.",
    "Dispose of used oil and filters according to local environmental rules.",
    "Record every maintenance task in the service log with the date and hours.",
    "Make sure the floor can carry the weight of the machine before installation.",
    "Allow the machine to cool down before touching hot surfaces.",
    "Transport the {machine} only with the lifting points marked on the frame.",
    "The control panel shows operating hours, warnings and the last {num} events.",
    "Store the machine in a dry room between 5 and {pct} degrees Celsius.",
    "Set the operating pressure with the knob on the left side of the panel.",
    "The emergency stop button must be reachable from the operator position.",
    "Check the oil level every morning with the dipstick behind the side cover.",
    "A qualified electrician must connect the machine to the mains supply.",
    "Level the machine with the adjustable feet before first use.",
    "After a power failure the machine restarts only when the reset key is pressed.",
    "The service interval counter can be reset after each completed service.",
    "Replace worn hoses immediately; never repair them with tape.",
    "Keep children and unauthorised persons away from the working area.",
    "Spare parts lists are available from the dealer in {city}.",
    "The residual current device must be tested every {num} days.",
    "Use the supplied key to open the electrical cabinet; close it after work.",
]
SLIDE_FILLER = [
    "Steering committee review of scope, schedule and budget",
    "Weekly stand-ups continue with all workstream leads",
    "Change requests are logged and assessed every Friday",
    "Communication plan shared with regional managers",
    "Training materials drafted for key users",
    "Data quality checks run nightly on migrated records",
    "Decision log updated after each steering meeting",
    "Dependencies with the finance calendar tracked",
]
PAPER_FILLER = [
    "Prior work has studied this problem mostly on small benchmarks.",
    "We follow the standard evaluation protocol and report the mean of five runs.",
    "All hyperparameters were tuned on the validation split only.",
    "Our implementation builds on widely used open-source libraries.",
    "The approach scales linearly with the number of input rows.",
    "We release code and configuration files to support reproducibility.",
    "Ablations isolate the contribution of each component of the model.",
    "Training used mixed precision on a single accelerator.",
    "Errors concentrate on rare categories with few training examples.",
    "The results suggest that simple baselines remain surprisingly strong.",
    "We discuss limitations and threats to validity in the final section.",
    "Statistical significance was assessed with a paired bootstrap test.",
    "We compare against {num} baselines drawn from recent literature.",
    "The training set contains about {num} thousand labelled examples.",
    "A learning rate warm-up over the first {pct} percent of steps stabilised training.",
    "Inference runs in real time on commodity hardware.",
    "We observe that performance saturates beyond a moderate model size.",
    "Annotations were produced by three experts with high agreement.",
    "Data augmentation improved robustness to noisy inputs.",
    "The model is sensitive to the choice of normalisation layer.",
    "Early stopping on validation loss avoided overfitting.",
    "Runtime is dominated by the preprocessing stage for long inputs.",
    "Our results hold across random seeds and data splits.",
    "Qualitative examples illustrate typical successes and failures.",
]
MINUTES_FILLER = [
    "The chair welcomed the members and confirmed that a quorum was present.",
    "The minutes of the previous meeting were approved without changes.",
    "Members discussed the budget position and agreed to review it next month.",
    "There was no other business and the meeting closed on time.",
    "The secretary will circulate the papers one week before the next meeting.",
    "Apologies were received from two members who were travelling.",
    "The treasurer reported that {pct}% of the annual budget has been used.",
    "{person} presented an update on the building works in {city}.",
    "The committee noted correspondence received since the last meeting.",
    "Members agreed to hold the next meeting in {month}.",
    "A declaration of interests was made and recorded.",
    "The risk register was reviewed and two new risks were added.",
    "The committee thanked the volunteers for their work over the summer.",
    "Members asked for a written report on energy costs.",
]
