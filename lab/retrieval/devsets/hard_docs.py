"""Equipment manuals, research papers and slide decks of the hard dev set."""

from __future__ import annotations

import random

from lab.retrieval.devsets.devset_families import slug
from lab.retrieval.devsets.devset_specs import CITIES, MONTHS
from lab.retrieval.devsets.hard_specs import Builder, Chart, HardDoc, unique_code, unique_person
from lab.retrieval.devsets.hard_text import (
    MACHINES,
    MANUAL,
    PAPER,
    PAPERS,
    PARTS,
    PROJECTS,
    SLIDES,
    fill,
    person,
)

CAUSES = ["Overtemperature in the control cabinet", "Low supply voltage", "Door interlock open",
          "Sensor cable disconnected", "Coolant level low", "Motor overload", "Filter clogged",
          "Communication error with the display", "Pressure above limit", "Fan blocked",
          "Phase missing on the supply", "Emergency stop pressed", "Service interval due"]


def manual(rng: random.Random, i: int, used: set[str]) -> Builder:
    """A 30-60 page operating manual with about six questions."""
    m = MACHINES[i]
    b = Builder(rng, HardDoc(f"{slug(m)}_manual.pdf", "manual",
                             title=f"{m}: operating and maintenance manual"))
    target = rng.randint(30, 60)
    b.add("cover", f"{m}: operating and maintenance manual", ["Original instructions.",
                                                              "Edition 4, 2024."])
    b.add("columns", "Contents", ["Safety", "Installation", "Operation", "Maintenance",
                                  "Troubleshooting", "Spare parts", "Warranty"])
    t_max = rng.randint(32, 45)
    safe = b.prose("Safety instructions", MANUAL, 20, facts=(
        f"Never operate the machine when the ambient temperature exceeds {t_max} degrees "
        f"Celsius.",))
    b.ask([safe], f"What is the maximum ambient temperature for operating the {m}?",
          f"How hot may the room get before the {m} must be switched off?", f"{t_max} C")
    for title in ["Safety instructions (continued)", "Transport and installation",
                  "Installation (continued)", "Electrical connection"]:
        b.prose(title, MANUAL, rng.randint(14, 20))
    weight = rng.randint(60, 4000)
    spec = [["Property", "Value"], ["Rated power", f"{rng.uniform(1, 40):.1f} kW"],
            ["Weight", f"{weight} kg"], ["Noise level", f"{rng.randint(58, 92)} dB(A)"],
            ["Supply voltage", rng.choice(["230 V 50 Hz", "400 V 3~ 50 Hz", "480 V 60 Hz"])],
            ["Protection class", rng.choice(["IP54", "IP55", "IP65"])],
            ["Operating temperature", "5 to 40 C"], ["Sound pressure", f"{rng.randint(60, 90)} dB"]]
    sp = b.add("table", "Technical data", ["Values measured under standard test conditions."],
               spec)
    b.ask([sp], f"What is the weight of the {m}?", f"How heavy is the {m}?", f"{weight} kg")
    for _ in range(rng.randint(3, 6)):
        b.prose("Operation", MANUAL, rng.randint(14, 20))
    parts = rng.sample(PARTS, 8)
    hours = [str(rng.choice([50, 100, 250, 500, 1000, 2000])) for _ in parts]
    sched = [["Task", "Interval (operating hours)"]] + [
        [f"Replace the {p}", h] for p, h in zip(parts, hours, strict=True)]
    ms = b.add("table", "Maintenance schedule", ["Keep this schedule to keep the warranty."],
               sched)
    k = rng.randrange(len(parts))
    b.ask([ms], f"How often should the {parts[k]} of the {m} be replaced?",
          f"After how many running hours does the {m} need a new {parts[k]}?", hours[k])
    codes = [unique_code(rng, used, "E###") for _ in range(10)]
    causes = rng.sample(CAUSES, 10)
    head = [["Code", "Cause"]]
    rows = [[cd, cs] for cd, cs in zip(codes, causes, strict=True)]
    tr = b.add("table", "Troubleshooting: fault codes", ["Switch off before any check."],
               head + rows[:5])
    b.add("table", "Troubleshooting: fault codes (continued)", [], head + rows[5:])
    a, z = rng.randint(0, 4), rng.randint(5, 9)
    b.ask([tr, tr + 1], f"What do the fault codes {codes[a]} and {codes[z]} mean on the {m}?",
          f"The {m} shows {codes[a]} and later {codes[z]}: what is wrong?",
          f"{causes[a]}; {causes[z]}")
    u = rng.randint(0, 9)
    b.ask([tr if u < 5 else tr + 1], f"What does fault code {codes[u]} mean?",
          f"A display shows {codes[u]}: what is the cause?", causes[u], named=False)
    order_no = unique_code(rng, used, "##-####-@")
    part = rng.choice(PARTS)
    spare = [["Part", "Order number"], [f"{part.capitalize()} (kit)", order_no]] + [
        [p.capitalize(), unique_code(rng, used, "##-####-@")] for p in rng.sample(PARTS, 7)]
    rng.shuffle(spare[1:])
    while len(b.doc.pages) < target - 3:
        b.prose(rng.choice(["Maintenance", "Cleaning", "Operation", "Adjustments",
                            "Troubleshooting", "Storage and disposal"]), MANUAL,
                rng.randint(12, 20))
    spare_page = b.add("table", "Spare parts list", ["Order through your dealer."], spare)
    b.ask([spare_page], f"Which part has the order number {order_no}?",
          f"What do I get if I order item {order_no}?", part, named=False)
    months = rng.choice([12, 18, 24, 36, 48])
    w = b.add("scan", "Warranty card", [
        f"Warranty card - {m}",
        f"The manufacturer grants a warranty of {months} months from the date of delivery.",
        *fill(rng, MANUAL, 4), "Keep this card with the invoice. Stamp of the dealer:"])
    b.ask([w], f"How long is the warranty of the {m}?",
          f"For how many months is the {m} covered against defects?", f"{months} months")
    b.add("scan", "EU declaration of conformity", [
        f"We declare that the {m} complies with the Machinery Directive.",
        f"Signed in {rng.choice(CITIES)} by {person(rng)}.", *fill(rng, MANUAL, 3)])
    return b


def paper(rng: random.Random, i: int, used: set[str]) -> Builder:
    """A 12-25 page two-column research paper with about five questions."""
    name, topic, data = PAPERS[i]
    title = f"{name}: {topic}"
    b = Builder(rng, HardDoc(f"{slug(name)}_paper.pdf", "paper", title=title))
    target = rng.randint(12, 25)
    authors = [person(rng) for _ in range(4)]
    b.add("cover", title, [", ".join(authors), *fill(rng, PAPER, 6, topic=topic)])
    b.prose("1 Introduction", PAPER, 22, topic=topic)
    b.prose("2 Related work", PAPER, 22, topic=topic)
    size = rng.randint(3, 90)
    ds = b.prose("3 Data", PAPER, 20, facts=(
        f"The {data} dataset contains {size} thousand examples collected over two years.",),
        topic=topic)
    b.ask([ds], f"How many examples does the {data} dataset contain?",
          f"How large is the {data} collection?", f"{size} thousand", named=False)
    b.prose("4 Method", PAPER, 22, topic=topic)
    b.prose("4 Method (continued)", PAPER, 20, topic=topic)
    cats = rng.sample(["urban", "rural", "night", "rain", "rare class", "long input",
                       "short input", "noisy labels", "new site", "winter"], 5)
    accs = [round(rng.uniform(55, 95), 1) for _ in cats]
    worst = cats[accs.index(min(accs))]
    fig = b.add("columns", "5 Results", [
        f"Figure 3. Accuracy of {name} by subset of the test data (percent).",
        *fill(rng, PAPER, 8, topic=topic)],
        chart=Chart("bar", f"{name} accuracy by subset (%)", cats, accs))
    b.ask([fig], f"On which subset of the test data does {name} have the lowest accuracy?",
          f"Where does {name} struggle most, judging by its per-subset scores?",
          f"{worst} ({min(accs)}%)")
    base, ours = round(rng.uniform(50, 75), 1), round(rng.uniform(76, 92), 1)
    res = b.prose("5 Results (continued)", PAPER, 14, topic=topic, facts=(
        f"On the full test set {name} reaches an F1 of {ours}.",))
    b.prose("5 Results (continued)", PAPER, 14, topic=topic, facts=(
        f"The strongest baseline reaches an F1 of {base} on the full test set.",))
    b.ask([res, res + 1], f"What F1 does {name} reach on the full test set, and what does the "
          f"strongest baseline reach?", f"By how much does {name} beat the best competing "
          f"method overall?", f"{ours} vs {base}")
    grant = unique_code(rng, used, "@@-####-##")
    while len(b.doc.pages) < target - 2:
        b.prose(rng.choice(["6 Analysis", "7 Discussion", "Appendix", "Appendix: extra results"]),
                PAPER, rng.randint(16, 22), topic=topic)
    ack = b.prose("Acknowledgements and references", PAPER, 10, topic=topic, facts=(
        f"This work was funded by grant {grant} of the {rng.choice(CITIES)} research council.",))
    b.ask([ack], f"Which grant funded the {name} paper?",
          f"Who paid for the research behind {name}?", grant)
    b.prose("References (continued)", PAPER, 12, topic=topic, columns=False)
    return b


def slide_deck(rng: random.Random, i: int, used: set[str]) -> Builder:
    """A 25-40 slide project review, a few slides only as screenshots; about six questions."""
    project = PROJECTS[i]
    title = f"{project[0].upper()}{project[1:]}: quarterly review"
    b = Builder(rng, HardDoc(f"{slug(project)}_review.pdf", "slides", landscape=True,
                             title=title))
    target = rng.randint(25, 40)
    b.add("slide", title, [f"Sponsor: {person(rng)}", "Steering committee, Q3 2024"])
    b.add("slide", "Agenda", ["Status", "Milestones", "Budget", "Risks", "Vendors", "Next steps"])
    month = rng.choice(MONTHS)
    reason = rng.choice(["the test environment was not ready", "key users were on holiday",
                         "interface specifications changed late", "a supplier delivered late"])
    st = b.add("slide", "Status summary", ["Overall status: amber",
                                          f"User acceptance testing slipped to {month} "
                                          f"because {reason}", *fill(rng, SLIDES, 2)])
    b.ask([st], f"Why did user acceptance testing slip in the {project}?",
          f"What held up the acceptance tests of the {project}?", reason)
    golive = f"{rng.choice(MONTHS)} {rng.choice([2025, 2026])}"
    ms = b.add("slide", "Milestones", [], [
        ["Milestone", "Planned", "Forecast"], ["Design sign-off", "Feb 2024", "Mar 2024"],
        ["Build complete", "Jun 2024", "Aug 2024"], ["Go-live", "Nov 2024", golive]])
    b.ask([ms], f"What is the forecast go-live date of the {project}?",
          f"When is the {project} now expected to go live?", golive)
    streams = rng.sample(["Data", "Integration", "Testing", "Training", "Infrastructure",
                          "Change", "Reporting"], 5)
    spend = [round(rng.uniform(0.2, 6.0), 1) for _ in streams]
    big = streams[spend.index(max(spend))]
    ch = b.add("slide", "Budget by workstream", ["Spend to date, EUR m (chart)"],
               chart=Chart("bar", "Spend to date by workstream (EUR m)", streams, spend))
    b.ask([ch], f"Which workstream of the {project} has spent the most so far?",
          f"Where has most of the {project}'s money gone to date?", f"{big} ({max(spend)})")
    vendor = rng.choice(["Brightlane Consulting", "Nimbus Systems", "Quartz Integrators",
                         "Redwood Partners", "Sable Digital"])
    score = rng.choice(["2 out of 5", "3 out of 5", "4 out of 5"])
    shot = [("Vendor scorecard", [f"{vendor} scored {score} for on-time delivery",
                                 "Quality of documentation: 3 out of 5"])]
    cr = unique_code(rng, used, "CR-####")
    cr_owner = unique_person(rng, used)
    shot.append(("Change requests", [f"{cr}: new reporting interface, owner {cr_owner}",
                                     *fill(rng, SLIDES, 2)]))
    shot.append(("Dashboard", fill(rng, SLIDES, 4)))
    filler_titles = ["Workstream update", "Key decisions", "Testing progress", "Training plan",
                     "Data migration", "Communication", "Lessons learned", "Appendix"]
    shot_at = sorted(rng.sample(range(len(b.doc.pages) + 1, target - 1), len(shot)))
    risk_at = rng.randint(len(b.doc.pages) + 1, target - 3)
    while len(b.doc.pages) < target:
        nxt = len(b.doc.pages) + 1
        if shot_at and nxt >= shot_at[0]:
            shot_at.pop(0)
            t, bullets = shot.pop(0)
            p = b.add("slide_image", t, bullets)
            if t == "Vendor scorecard" and rng.random() < 0.5:
                b.ask([p], f"How did {vendor} score on on-time delivery in the {project}?",
                      f"How punctual was {vendor} on the {project}, per the scorecard?", score)
            elif t == "Change requests":
                b.ask([p], f"Who owns change request {cr}?",
                      f"Which person is responsible for {cr}?", cr_owner, named=False)
        elif nxt == risk_at:
            risks = rng.sample(["loss of two senior developers", "licence costs rising",
                                "data migration errors", "union consultation delays",
                                "cyber security audit findings", "budget freeze"], 4)
            p = b.add("slide", "Risks and issues (1/2)", [f"Top risk: {risks[0]}",
                                                         f"Second risk: {risks[1]}"])
            b.add("slide", "Risks and issues (2/2)", [f"Third risk: {risks[2]}",
                                                     f"Fourth risk: {risks[3]}"])
            b.ask([p, p + 1], f"What are the top and the third risks of the {project}?",
                  f"Which threats to the {project} rank first and third?",
                  f"{risks[0]}; {risks[2]}")
        else:
            b.add("slide", rng.choice(filler_titles), fill(rng, SLIDES, rng.randint(3, 5)))
    return b
