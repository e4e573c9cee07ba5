"""The five document families of the retrieval dev set and the questions about each document.

Every family shares templates across its documents (that is what makes the other documents
realistic distractors: ten annual reports all have a capex row and a dividend resolution),
and each question targets one page's distinctive fact, worded either with the page's own
words ("lexical") or with synonyms ("paraphrase").
"""

from __future__ import annotations

import random

from lab.retrieval.devsets.devset_specs import (
    CITIES,
    MANUAL_FILLER,
    MINUTES_FILLER,
    MONTHS,
    PAPER_FILLER,
    PEOPLE,
    REPORT_FILLER,
    SLIDE_FILLER,
    DocSpec,
    PageSpec,
    QuestionSpec,
    ask,
    filler,
    paragraphs,
    plant,
)

COMPANIES = ["Norrvik Energy", "Caldera Foods", "Brightwater Logistics", "Meridian Textiles",
             "Oakhurst Pharmaceuticals", "Solano Robotics", "Tidewell Shipping",
             "Granitefield Mining", "Lumen Retail Group", "Arbor Telecom"]
MACHINES = ["Vectra HX-200 hydraulic press", "Kestrel K5 industrial dehumidifier",
            "Orion L-40 CNC lathe", "Pelican FS-9 floor scrubber", "Tundra BC-12 blast chiller",
            "Atlas AC-3 forklift charger", "Corvid PX-7 plasma cutter",
            "Halcyon WT-2 water treatment skid"]
PROJECTS = ["Helios ERP migration", "Northstar data lake", "Falcon mobile app relaunch",
            "Orchid warehouse automation", "Cobalt cloud cost review", "Juniper customer portal",
            "Quasar payroll consolidation", "Tamarind store refit"]
PAPERS = [("GridFormer", "sparse attention for tabular forecasting", "ElectraLoad"),
          ("LeafNet", "few-shot plant disease detection", "CropLeaf-12"),
          ("TideCast", "probabilistic sea level nowcasting", "NordTide"),
          ("RouteMind", "learning delivery routes from GPS traces", "UrbanDrops"),
          ("SpecTrace", "anomaly detection in spectrometer logs", "LabSpec-3"),
          ("QuillQA", "question answering over handwritten archives", "ArchiveHands")]
COMMITTEES = ["Harbour Board finance committee", "Riverside Hospital ethics committee",
              "Westfield School governors", "Lakeside Cooperative housing committee",
              "Northgate Library trustees", "Summit Cycling Club committee"]


def slug(name: str) -> str:
    """A file-name form of `name`."""
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")


def annual_report(rng: random.Random, i: int) -> tuple[DocSpec, list[QuestionSpec]]:
    """An eight-page annual report with columns, tables and a scanned resolution."""
    company = COMPANIES[i]
    hq, hub, site = rng.sample(CITIES, 3)
    ceo, chair, auditor, *board = rng.sample(PEOPLE, 6)
    doc = DocSpec(f"{slug(company)}_annual_report_2023.pdf", "report")
    fill = {"company": company}
    doc.pages.append(PageSpec("cover", f"{company} Annual Report 2023", [
        f"{company} is headquartered in {hq}.", "Annual Report and Accounts 2023."]))
    jobs, trained = rng.randint(80, 400), rng.randint(300, 2500)
    hub_fact = (f"In {rng.choice(MONTHS)} we opened a new distribution hub in {hub}, "
                f"adding {jobs} jobs.")
    letter = filler(rng, REPORT_FILLER, 22, **fill)
    plant(rng, letter, hub_fact)
    plant(rng, letter, f"This year {trained} employees completed our leadership programme.")
    doc.pages.append(PageSpec("columns", f"Letter from the CEO, {ceo}", paragraphs(letter, 4)))
    years = ["2021", "2022", "2023"]
    base = rng.uniform(800, 5000)
    rows = [["", *years]]
    for label, scale in [("Revenue (EUR m)", 1.0), ("Operating profit (EUR m)", 0.11),
                         ("Net income (EUR m)", 0.07), ("Capital expenditure (EUR m)", 0.06)]:
        rows.append([label] + [f"{base * scale * rng.uniform(0.85, 1.2):,.0f}" for _ in years])
    rows.append(["Operating margin (%)"] + [f"{rng.uniform(6, 16):.1f}" for _ in years])
    rows.append(["Employees at year end"] + [f"{rng.randint(2000, 30000):,}" for _ in years])
    doc.pages.append(PageSpec("table", "Financial highlights", [
        "Key figures for the last three financial years."], rows))
    regions = ["Nordics", "DACH", "Iberia", "North America", "Asia-Pacific"]
    fastest = rng.choice(regions)
    growth = {r: rng.uniform(-3, 9) for r in regions}
    growth[fastest] = rng.uniform(12, 20)
    regional = [["Region", "Revenue (EUR m)", "Growth (%)"]] + [
        [r, f"{base * rng.uniform(0.1, 0.3):,.0f}", f"{growth[r]:+.1f}"] for r in regions]
    doc.pages.append(PageSpec("table", "Revenue by region", [
        "Revenue is allocated by the location of the customer."], regional))
    cut, emissions = rng.randint(8, 35), rng.randint(40, 900)
    sustain = filler(rng, REPORT_FILLER, 18, **fill)
    plant(rng, sustain, f"Water withdrawal at the {site} site fell by {cut}% after closed-loop "
                      f"cooling was installed.")
    plant(rng, sustain, f"Scope 1 and 2 emissions were {emissions} kilotonnes of CO2e.")
    doc.pages.append(PageSpec("columns", "Sustainability", paragraphs(sustain, 4)))
    customer = rng.choice(["Halvorsen Retail", "Pacifica Foods", "Stellar Motors",
                           "Greenway Grocers", "Ironbridge Utilities", "Bluepeak Airlines"])
    share = rng.randint(9, 24)
    risks = filler(rng, REPORT_FILLER, 16, **fill)
    plant(rng, risks, f"Our largest customer, {customer}, accounted for {share}% of revenue; "
                    f"losing it would hurt results.")
    plant(rng, risks, "A cyberattack on our order management system could interrupt deliveries.")
    doc.pages.append(PageSpec("columns", "Principal risks", paragraphs(risks, 4)))
    dividend = f"EUR {rng.uniform(0.2, 3.5):.2f}"
    day = f"{rng.randint(1, 28)} {rng.choice(MONTHS)} 2024"
    doc.pages.append(PageSpec("scan", "Extract of board resolution", [
        f"Board of Directors of {company}",
        f"Resolution: the board approved a final dividend of {dividend} per share, "
        f"payable on {day}.",
        *filler(rng, MINUTES_FILLER, 4),
        f"Signed by {chair}, Chair of the Board."]))
    doc.pages.append(PageSpec("columns", "Corporate governance", paragraphs([
        f"{chair} chairs the board of directors.",
        f"The audit committee is chaired by {auditor}.",
        "Board members: " + ", ".join(board) + ".",
        "The board met eleven times during the year.",
        "Directors are elected by the annual general meeting for one year at a time.",
        *filler(rng, REPORT_FILLER, 8, **fill)])))
    qs: list[QuestionSpec] = []
    ask(rng, doc, 1, f"Where is {company} headquartered?",
        f"In which city is the head office of {company}?", qs)
    ask(rng, doc, 2, f"Where did {company} open a new distribution hub?",
        f"In which city did {company} launch its latest logistics centre?", qs)
    ask(rng, doc, 3, f"What was the capital expenditure of {company} in 2022?",
        f"How much did {company} spend on capex in 2022?", qs)
    ask(rng, doc, 4, f"Which region had the highest revenue growth at {company}?",
        f"In which part of the world did {company}'s sales expand fastest?", qs)
    ask(rng, doc, 5, f"By how much did water withdrawal fall at the {site} site of {company}?",
        f"How much did {company} cut water consumption at its {site} plant?", qs)
    ask(rng, doc, 6, f"Which customer accounted for the largest share of {company} revenue?",
        f"Who is the biggest client of {company}?", qs)
    ask(rng, doc, 7, f"What final dividend per share did the board of {company} approve?",
        f"How much will {company} pay its shareholders for each share?", qs)
    ask(rng, doc, 8, f"Who chairs the audit committee of {company}?",
        f"Which director leads {company}'s audit committee?", qs)
    return doc, qs


def manual(rng: random.Random, i: int) -> tuple[DocSpec, list[QuestionSpec]]:
    """A six-page equipment manual with specification tables and a scanned warranty card."""
    machine = MACHINES[i]
    model = machine.split()[1]
    doc = DocSpec(f"{slug(machine)}_manual.pdf", "manual")
    fill = {"machine": machine}
    doc.pages.append(PageSpec("cover", f"{machine}: operating and maintenance manual", [
        f"Original instructions for the {machine}, model {model}.", "Edition 3, 2023."]))
    t_max = rng.randint(32, 45)
    safety = filler(rng, MANUAL_FILLER, 20, **fill)
    plant(rng, safety, f"Never operate the {machine} when the ambient temperature exceeds "
                     f"{t_max} degrees Celsius.")
    doc.pages.append(PageSpec("columns", "Safety instructions", paragraphs(safety, 4)))
    spec = [["Property", "Value"],
            ["Rated power", f"{rng.uniform(1, 40):.1f} kW"],
            ["Weight", f"{rng.randint(60, 4000)} kg"],
            ["Dimensions (L x W x H)", f"{rng.randint(60, 300)} x {rng.randint(50, 200)} x "
                                       f"{rng.randint(80, 250)} cm"],
            ["Noise level", f"{rng.randint(58, 92)} dB(A)"],
            ["Supply voltage", rng.choice(["230 V 50 Hz", "400 V 3~ 50 Hz", "480 V 3~ 60 Hz"])],
            ["Protection class", rng.choice(["IP54", "IP55", "IP65"])]]
    doc.pages.append(PageSpec("table", "Technical specifications", [
        "Values measured under standard test conditions."], spec))
    part = rng.choice(["intake filter", "drive belt", "seal kit", "coolant pump"])
    interval = rng.choice([250, 500, 1000, 2000])
    schedule = [["Task", "Interval"], ["Visual inspection", "Daily"],
                ["Lubricate guide rails", "Weekly"],
                [f"Replace the {part}", f"Every {interval} operating hours"],
                ["Check electrical connections", "Every 6 months"],
                ["Full service by technician", "Yearly"]]
    doc.pages.append(PageSpec("table", "Maintenance schedule", [
        "Follow this schedule to keep the warranty valid."], schedule))
    code = rng.randint(10, 99)
    causes = ["Overtemperature in the control cabinet", "Low supply voltage detected",
              "Door interlock open", "Sensor cable disconnected"]
    cause = rng.choice(causes)
    trouble = [f"E{code}: {cause}. Switch off, wait ten minutes and check the cause "
               f"before restarting."] + [
        f"E{rng.randint(100, 199)}: {c}. Contact service if the message returns."
        for c in causes if c != cause] + paragraphs(filler(rng, MANUAL_FILLER, 8, **fill), 4)
    doc.pages.append(PageSpec("columns", "Troubleshooting", trouble))
    months = rng.choice([12, 18, 24, 36, 48])
    doc.pages.append(PageSpec("scan", "Warranty card", [
        f"Warranty card - {machine}",
        f"The manufacturer grants a warranty of {months} months from the date of delivery.",
        *filler(rng, MANUAL_FILLER, 4, **fill),
        "Keep this card with the invoice. Stamp of the dealer:"]))
    qs: list[QuestionSpec] = []
    ask(rng, doc, 2, f"What is the maximum ambient temperature for operating the {machine}?",
        f"How hot may the room be before the {machine} must not be used?", qs)
    ask(rng, doc, 3, f"What is the weight of the {machine}?",
        f"How heavy is the {machine}?", qs)
    ask(rng, doc, 4, f"How often should the {part} of the {machine} be replaced?",
        f"After how many running hours is a new {part} needed on the {machine}?", qs)
    ask(rng, doc, 5, f"What does error E{code} mean on the {machine}?",
        f"The {machine} displays fault E{code}: what is the cause?", qs)
    ask(rng, doc, 6, f"How long is the warranty of the {machine}?",
        f"For how many months is the {machine} covered against defects?", qs)
    return doc, qs


def slide_deck(rng: random.Random, i: int) -> tuple[DocSpec, list[QuestionSpec]]:
    """A seven-slide project review; one slide is a screenshot (text only as pixels)."""
    project = PROJECTS[i]
    title = project[0].upper() + project[1:]
    sponsor, lead = rng.sample(PEOPLE, 2)
    doc = DocSpec(f"{slug(project)}_review.pdf", "slides", landscape=True)
    doc.pages.append(PageSpec("slide", f"{title}: quarterly review", [
        f"Sponsor: {sponsor}", f"Programme lead: {lead}", "Steering committee, Q3 2024"]))
    month = rng.choice(MONTHS)
    reason = rng.choice(["the test environment was not ready", "key users were on holiday",
                         "interface specifications changed late", "a supplier delivered late"])
    bullets = rng.sample(SLIDE_FILLER, 3)
    bullets.insert(1, f"User acceptance testing slipped to {month} because {reason}")
    doc.pages.append(PageSpec("slide", "Status summary", ["Overall status: amber", *bullets]))
    golive = f"{rng.choice(MONTHS)} {rng.choice([2025, 2026])}"
    doc.pages.append(PageSpec("slide", "Milestones", [], [
        ["Milestone", "Planned", "Forecast"], ["Design sign-off", "Feb 2024", "Mar 2024"],
        ["Build complete", "Jun 2024", "Aug 2024"], ["Go-live", "Nov 2024", golive]]))
    approved = rng.randint(2, 40)
    spent = rng.randint(20, 90)
    doc.pages.append(PageSpec("slide", "Budget", [], [
        ["Item", "EUR m"], ["Approved budget", f"{approved:.1f}"],
        ["Spent to date", f"{approved * spent / 100:.1f} ({spent}%)"],
        ["Forecast at completion", f"{approved * rng.uniform(0.95, 1.3):.1f}"]]))
    risk = rng.choice(["loss of two senior developers", "licence costs rising in 2025",
                       "data migration errors in legacy records", "union consultation delays"])
    doc.pages.append(PageSpec("slide", "Risks and issues", [
        f"Top risk: {risk}", *rng.sample(SLIDE_FILLER, 2)]))
    vendor = rng.choice(["Brightlane Consulting", "Nimbus Systems", "Quartz Integrators",
                         "Redwood Partners", "Sable Digital"])
    score = rng.choice(["2 out of 5", "3 out of 5", "4 out of 5"])
    doc.pages.append(PageSpec("slide_image", "Vendor scorecard", [
        f"{vendor} scored {score} for on-time delivery",
        "Quality of documentation: 3 out of 5", "Responsiveness: 4 out of 5"]))
    doc.pages.append(PageSpec("slide", "Next steps", rng.sample(SLIDE_FILLER, 4)))
    qs: list[QuestionSpec] = []
    ask(rng, doc, 2, f"Why did user acceptance testing slip in the {project}?",
        f"What delayed UAT for the {project}?", qs)
    ask(rng, doc, 3, f"What is the forecast go-live date of the {project}?",
        f"When is the {project} now expected to launch?", qs)
    ask(rng, doc, 4, f"How much of the approved budget of the {project} has been spent?",
        f"How much money has the {project} used so far?", qs)
    ask(rng, doc, 5, f"What is the top risk of the {project}?",
        f"What is the biggest threat to the {project}?", qs)
    ask(rng, doc, 6, f"How did {vendor} score for on-time delivery in the {project}?",
        f"How punctual was {vendor} according to the {project} scorecard?", qs)
    return doc, qs


def paper(rng: random.Random, i: int) -> tuple[DocSpec, list[QuestionSpec]]:
    """A five-page two-column research paper with a results table."""
    name, topic, dataset = PAPERS[i]
    doc = DocSpec(f"{slug(name)}_paper.pdf", "paper")
    authors = ", ".join(rng.sample(PEOPLE, 3))
    intro = filler(rng, PAPER_FILLER, 16)
    intro.insert(0, f"We present {name}, a method for {topic}.")
    doc.pages.append(PageSpec("columns", f"{name}: {topic}", [f"Authors: {authors}.",
                                                             *paragraphs(intro)]))
    window, heads = rng.choice([64, 128, 256, 512]), rng.choice([4, 8, 12, 16])
    method = filler(rng, PAPER_FILLER, 18)
    plant(rng, method, f"{name} uses an attention window of {window} positions and {heads} "
                     f"heads in every layer.")
    doc.pages.append(PageSpec("columns", "Method", paragraphs(method)))
    ours = rng.uniform(70, 95)
    table = [["Dataset", "Baseline", name]] + [
        [d, f"{ours - rng.uniform(2, 9):.1f}",
         f"{ours if d == dataset else rng.uniform(60, 90):.1f}"]
        for d in rng.sample(["Metro-9", "Ridge-4", "Delta-2"], 2) + [dataset]]
    doc.pages.append(PageSpec("table", "Results", [
        "Accuracy (%) on the test split of each dataset."], table))
    future = rng.choice(["multilingual inputs", "streaming data", "edge devices",
                         "active learning"])
    end = filler(rng, PAPER_FILLER, 16)
    plant(rng, end, f"In future work we will extend {name} to {future}.")
    doc.pages.append(PageSpec("columns", "Discussion and conclusion", paragraphs(end)))
    doc.pages.append(PageSpec("columns", "References", [
        f"[{k}] {p.split()[0]} et al. Notes on {t}. 2021." for k, (p, t) in
        enumerate(zip(rng.sample(PEOPLE, 6), ["time series", "graphs", "vision", "speech",
                                              "robotics", "retrieval"], strict=True), 1)]))
    qs: list[QuestionSpec] = []
    ask(rng, doc, 2, f"How large is the attention window of {name}?",
        f"How many positions does each {name} layer attend over?", qs)
    ask(rng, doc, 3, f"What accuracy does {name} reach on {dataset}?",
        f"How well does {name} score on the {dataset} benchmark?", qs)
    ask(rng, doc, 4, f"What will future work extend {name} to?",
        f"What are the next research directions planned for {name}?", qs)
    return doc, qs


def minutes(rng: random.Random, i: int) -> tuple[DocSpec, list[QuestionSpec]]:
    """Three scanned pages of meeting minutes: all text is in images."""
    committee = COMMITTEES[i]
    doc = DocSpec(f"{slug(committee)}_minutes.pdf", "minutes")
    day = f"{rng.randint(1, 28)} {rng.choice(MONTHS)} 2024"
    chair, owner, *present = rng.sample(PEOPLE, 6)
    doc.pages.append(PageSpec("scan", f"Minutes of the {committee}", [
        f"Meeting held on {day}.", f"Chair: {chair}.", "Present: " + ", ".join(present) + ".",
        *filler(rng, MINUTES_FILLER, 6)]))
    amount = rng.randint(5, 90) * 1000
    purpose = rng.choice(["roof repairs", "new lighting", "a cyber security audit",
                          "replacement boilers", "accessible entrances"])
    doc.pages.append(PageSpec("scan", "Decisions", [
        f"Decision: the committee approved spending of EUR {amount:,} on {purpose}.",
        *filler(rng, MINUTES_FILLER, 6)]))
    action = rng.choice(["obtain three quotes", "draft the annual report",
                         "update the risk register", "contact the insurer"])
    doc.pages.append(PageSpec("scan", "Action items", [
        f"Action: {owner} to {action} before the next meeting.",
        *filler(rng, MINUTES_FILLER, 6)]))
    qs: list[QuestionSpec] = []
    ask(rng, doc, 2, f"How much spending on {purpose} did the {committee} approve?",
        f"What amount did the {committee} authorise for {purpose}?", qs)
    ask(rng, doc, 3, f"Who will {action} for the {committee}?",
        f"Which member of the {committee} has the task to {action}?", qs)
    return doc, qs


FAMILIES = [(annual_report, len(COMPANIES)), (manual, len(MACHINES)),
            (slide_deck, len(PROJECTS)), (paper, len(PAPERS)), (minutes, len(COMMITTEES))]
