"""Long annual reports and scanned filings of the hard dev set (see `hard_docs` for the rest).

Every report has the same sections (highlights table, segment chart, risks, sustainability,
a scanned board resolution, governance, dozens of notes to the accounts), so the other
reports are distractors for each question; the company is named only on the cover unless
the document has a running header.
"""

from __future__ import annotations

import random

from lab.retrieval.devsets.devset_families import slug
from lab.retrieval.devsets.devset_specs import CITIES, MONTHS
from lab.retrieval.devsets.hard_specs import Builder, Chart, HardDoc, unique_code, unique_person
from lab.retrieval.devsets.hard_text import (
    COMPANIES,
    FILING,
    REPORT,
    SEGMENTS,
    fill,
    person,
)

LOANS = ["Green bond 2028", "Revolving credit facility", "Term loan A", "Term loan B",
         "Schuldschein 2027", "Commercial paper", "Export credit loan", "Private placement 2030",
         "Convertible bond 2026", "Sustainability-linked loan"]
NOTE_TOPICS = ["Revenue from contracts with customers", "Other operating income", "Personnel",
               "Finance income and costs", "Income taxes", "Intangible assets",
               "Property, plant and equipment", "Leases", "Inventories", "Trade receivables",
               "Cash and cash equivalents", "Equity", "Provisions", "Pensions",
               "Financial risk management", "Related parties", "Contingent liabilities",
               "Events after the reporting period", "Share-based payments", "Acquisitions",
               "Segment information", "Capital commitments", "Auditor's fees", "Government grants"]


def annual_report(rng: random.Random, i: int, used: set[str]) -> Builder:
    """A 50-80 page annual report with about eight questions."""
    c = COMPANIES[i]
    b = Builder(rng, HardDoc(f"{slug(c)}_annual_report_2023.pdf", "report",
                             title=f"{c} Annual Report 2023"))
    target = rng.randint(50, 80)
    b.add("cover", f"{c} Annual Report 2023", [f"{c} is headquartered in {rng.choice(CITIES)}.",
                                                "Annual Report and Accounts 2023."])
    b.add("columns", "Contents", ["Chair's statement", "Chief executive's review", "Strategy",
                                  "Segment review", "Sustainability", "Principal risks",
                                  "Governance", "Remuneration", "Financial statements",
                                  "Notes to the accounts", "Shareholder information"])
    b.prose("Chair's statement", REPORT, 20)
    b.prose("Chief executive's review", REPORT, 22)
    b.prose("Chief executive's review (continued)", REPORT, 18)
    years = ["2021", "2022", "2023"]
    base = rng.uniform(800, 5000)
    rows = [["", *years]]
    capex = [f"{base * 0.06 * rng.uniform(0.85, 1.2):,.0f}" for _ in years]
    for label, scale in [("Revenue (EUR m)", 1.0), ("Operating profit (EUR m)", 0.11),
                         ("Net income (EUR m)", 0.07), ("Free cash flow (EUR m)", 0.05)]:
        rows.append([label] + [f"{base * scale * rng.uniform(0.85, 1.2):,.0f}" for _ in years])
    rows.insert(rng.randint(2, 5), ["Capital expenditure (EUR m)", *capex])
    rows.append(["Employees at year end"] + [f"{rng.randint(2000, 30000):,}" for _ in years])
    hi = b.add("table", "Financial highlights", ["Key figures for the last three years."], rows)
    b.ask([hi], f"What was the capital expenditure of {c} in 2022?",
          f"How much did {c} invest in new equipment and facilities in 2022?",
          f"EUR {capex[1]} million")
    for _ in range(rng.randint(2, 3)):
        b.prose("Strategy", REPORT, 20)
    segs = rng.sample(SEGMENTS, 4)
    values = [float(round(base * rng.uniform(0.1, 0.4))) for _ in segs]
    top = rng.choice(segs)
    chart = b.add("columns", "Segment review", [
        "Figure 2. Revenue by segment, 2023 (EUR million).",
        *fill(rng, REPORT, 3)],
        chart=Chart("bar", "Revenue by segment 2023 (EUR m)", segs, values))
    b.ask([chart], f"What was the 2023 revenue of the {top} segment of {c}?",
          f"How much did {c}'s {top} business sell in 2023?",
          f"EUR {values[segs.index(top)]:.0f} million")
    for seg in segs:
        b.number_table(f"Segment review: {seg}", f"Key figures of the {seg} segment.", rows=6)
        b.prose(f"Segment review: {seg}", REPORT, 16)
    site, cut = rng.choice(CITIES), rng.randint(8, 35)
    sus = b.prose("Sustainability", REPORT, 18, facts=(
        f"Water withdrawal at the {site} site fell by {cut}% after closed-loop cooling was "
        f"installed.",))
    b.ask([sus], f"By how much did water withdrawal fall at the {site} site of {c}?",
          f"How much less water did {c}'s {site} factory take in after its cooling upgrade?",
          f"{cut}%")
    for _ in range(rng.randint(2, 3)):
        b.prose("Sustainability", REPORT, 20)
    patents, hires = rng.randint(20, 400), rng.randint(100, 3000)
    figs = ["Patents filed", "New hires", "Sites", "Countries"]
    nums = [patents, hires, rng.randint(10, 90), rng.randint(5, 40)]
    if rng.random() < 0.5:
        box = b.add("columns", "Our year in numbers", [
            "Figure 5. Highlights of the year.", *fill(rng, REPORT, 2)],
            chart=Chart("boxes", "2023 at a glance", figs, [float(n) for n in nums]))
        b.ask([box], f"How many patents did {c} file in 2023?",
              f"How many inventions did {c} seek patent protection for last year?", str(patents))
    customer = rng.choice(["Halvorsen Retail", "Pacifica Foods", "Stellar Motors",
                           "Greenway Grocers", "Ironbridge Utilities", "Bluepeak Airlines"])
    share = rng.randint(9, 24)
    risk = b.prose("Principal risks", REPORT, 18, facts=(
        f"Our largest customer, {customer}, accounted for {share}% of revenue; losing it "
        f"would hurt results.",))
    b.ask([risk], f"Which customer accounted for the largest share of {c}'s revenue?",
          f"Who is the biggest client of {c}, and how dependent is it on them?",
          f"{customer}, {share}%")
    b.prose("Principal risks (continued)", REPORT, 18)
    dividend = f"EUR {rng.uniform(0.2, 3.5):.2f}"
    res = b.add("scan", "Extract of board resolution", [
        f"Board of Directors of {c}",
        f"Resolution: the board approved a final dividend of {dividend} per share, payable on "
        f"{rng.randint(1, 28)} {rng.choice(MONTHS)} 2024.",
        *fill(rng, REPORT, 2), f"Signed by {person(rng)}, Chair of the Board."])
    b.ask([res], f"What final dividend per share did the board of {c} approve?",
          f"How much will {c} pay its shareholders for each share they own?", dividend)
    uniq = unique_person(rng, used)
    committee = rng.choice(["remuneration", "nomination", "audit", "sustainability"])
    gov = b.prose("Corporate governance", REPORT, 16, facts=(
        f"{uniq} chairs the {committee} committee and joined the board in "
        f"{rng.choice(MONTHS)} 2019.",))
    b.ask([gov], f"Which committee does {uniq} chair?",
          f"What board committee is led by {uniq}?", f"the {committee} committee", named=False)
    b.prose("Board of directors", REPORT, 16)
    b.prose("Remuneration report", REPORT, 18)
    b.number_table("Directors' remuneration", "Fixed and variable pay (EUR thousand).", rows=7)
    for title in ["Consolidated income statement", "Consolidated balance sheet",
                  "Consolidated cash flow statement"]:
        b.number_table(title, "Amounts in EUR million.", rows=14)
    loans = rng.sample(LOANS, 8)
    rates = [f"{rng.uniform(1.0, 7.5):.2f}%" for _ in loans]
    note_at = rng.randint(2, 8)
    n = 1
    while len(b.doc.pages) < target - 3:
        topic = rng.choice(NOTE_TOPICS)
        if n == note_at:
            head = [["Facility", "Interest rate", "2023", "2022"]]
            table = [[ln, r, f"{rng.uniform(20, 900):,.1f}", f"{rng.uniform(20, 900):,.1f}"]
                     for ln, r in zip(loans, rates, strict=True)]
            p1 = b.add("table", f"Note {n}. Borrowings", ["Interest-bearing loans at year end."],
                       head + table[:4])
            b.add("table", f"Note {n}. Borrowings (continued)", [], head + table[4:])
            a, z = rng.randint(0, 3), rng.randint(4, 7)
            b.ask([p1, p1 + 1], f"What are the interest rates of the {loans[a]} and the "
                  f"{loans[z]} of {c}?", f"How much interest does {c} pay on its {loans[a]} "
                  f"compared with its {loans[z]}?", f"{rates[a]} and {rates[z]}")
        elif rng.random() < 0.6:
            b.number_table(f"Note {n}. {topic}", f"This note explains {topic.lower()}.",
                           rows=rng.randint(6, 13))
        else:
            b.prose(f"Note {n}. {topic}", REPORT, rng.randint(12, 20), columns=False)
        n += 1
    b.number_table("Five-year summary", "Amounts in EUR million.", rows=12)
    b.prose("Shareholder information", REPORT, 12)
    b.prose("Glossary and alternative performance measures", REPORT, 14, columns=False)
    return b


def filing(rng: random.Random, i: int, used: set[str]) -> Builder:
    """An 8-20 page scanned company filing; every page is an image."""
    c = COMPANIES[i % len(COMPANIES)]
    kind = ["annual return", "confirmation statement", "notice of change of directors",
            "statement of capital"][i % 4]
    number = unique_code(rng, used, "0######")
    b = Builder(rng, HardDoc(f"{slug(c)}_{slug(kind)}_{number}.pdf", "filing",
                             title=f"{c} - {kind} ({number})", scan_dpi=150))
    b.add("scan", f"{kind.title()}", [f"Company name: {c}", f"Company number: {number}",
                                      f"Registered office: {rng.choice(CITIES)}",
                                      "Made up to 31 December 2023"])
    pages = rng.randint(8, 20)
    appointed, resigned = unique_person(rng, used), unique_person(rng, used)
    day = f"{rng.randint(1, 28)} {rng.choice(MONTHS)} 2023"
    shares = rng.randint(100_000, 9_000_000)
    nominal = f"EUR {rng.choice(['0.01', '0.05', '0.10', '1.00'])}"
    secretary = person(rng)
    facts = [
        ("Directors", [f"{appointed} was appointed as a director on {day}.",
                       f"{resigned} resigned as a director on the same date."],
         f"On what date was {appointed} appointed as a director?",
         f"When did {appointed} join the board?", day, False),
        ("Statement of capital", [f"Ordinary shares in issue: {shares:,}.",
                                  f"Nominal value per share: {nominal}."],
         f"How many ordinary shares of {c} were in issue according to its {kind}?",
         f"How many shares had {c} issued according to the {kind} it filed?",
         f"{shares:,}", True),
        ("Company secretary", [f"The company secretary is {secretary}."],
         f"Who is the company secretary named in the {kind} of {c}?",
         f"Who acts as {c}'s company secretary according to its {kind}?", secretary, True),
    ]
    slots = rng.sample(range(2, pages), len(facts) + 1)
    cont_at = slots[-1]
    body = {s: f for s, f in zip(slots, facts, strict=False)}
    officers = [unique_person(rng, used) for _ in range(6)]
    roles = [rng.choice(["director", "secretary", "member"]) for _ in officers]
    for p in range(2, pages + 1):
        if p in body:
            title, lines, lex, para, ans, named = body[p]
            at = b.add("scan", title, [*fill_filing(rng, 3), *lines, *fill_filing(rng, 3)])
            if title != "Company secretary" or rng.random() < 0.5:
                b.ask([at], lex, para, ans, named=named)
        elif p == cont_at and p < pages:
            at = b.add("scan", "Register of officers", [
                *fill_filing(rng, 2), *(f"{o}: {r}" for o, r in zip(officers[:3], roles,
                                                                    strict=False))])
            b.add("scan", "Register of officers (continued)", [
                *(f"{o}: {r}" for o, r in zip(officers[3:], roles[3:], strict=True)),
                *fill_filing(rng, 3)])
            b.ask([at, at + 1], f"What roles do {officers[0]} and {officers[4]} hold at {c}?",
                  f"In what capacity are {officers[0]} and {officers[4]} registered with {c}?",
                  f"{roles[0]}; {roles[4]}")
        elif len(b.doc.pages) < pages:
            b.add("scan", rng.choice(["Notes", "Declaration", "Particulars", "Continuation"]),
                  fill_filing(rng, rng.randint(5, 9)))
    return b


def fill_filing(rng: random.Random, n: int) -> list[str]:
    """Filler lines of a company filing."""
    return fill(rng, FILING, n)
