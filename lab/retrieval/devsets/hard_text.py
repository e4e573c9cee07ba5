"""Text pools of the hard retrieval dev set: entity names and combinatorial filler.

Filler sentences are templates whose `{slots}` are filled from shared vocabularies (metrics,
segments, equipment parts, regions...), so the words that questions use ("capital
expenditure", "dividend", "warranty", "accuracy") recur on many pages that carry no answer.
"""

from __future__ import annotations

import random

from lab.retrieval.devsets.devset_specs import CITIES, MONTHS

FIRST = ["Ingrid", "Marco", "Aisha", "Tomasz", "Claire", "Henrik", "Priya", "Jonas", "Elena",
         "Samuel", "Lucia", "Rafael", "Mei", "Oliver", "Fatima", "Anders", "Sofia", "Daniel",
         "Nora", "Kofi", "Yusuf", "Greta", "Mateo", "Hana", "Viktor", "Leila", "Pieter",
         "Amara", "Stefan", "Rosa", "Arjun", "Freya", "Dmitri", "Ines", "Tobias", "Zara"]
LAST = ["Solberg", "Bellini", "Rahman", "Nowak", "Dubois", "Lund", "Natarajan", "Becker",
        "Petrova", "Okafor", "Fernandez", "Costa", "Tanaka", "Grant", "Zahra", "Holm", "Rossi",
        "Weiss", "Lindqvist", "Mensah", "Varga", "Moreau", "Keller", "Ito", "Novak", "Haddad",
        "Jansen", "Oyelaran", "Brandt", "Silva", "Mehta", "Kowalski", "Eriksen", "Duarte"]

COMPANIES = ["Norrvik Energy", "Caldera Foods", "Brightwater Logistics", "Meridian Textiles",
             "Oakhurst Pharmaceuticals", "Solano Robotics", "Tidewell Shipping",
             "Granitefield Mining", "Lumen Retail Group", "Arbor Telecom", "Vellamo Paper",
             "Castellan Building Materials"]
MACHINES = ["Vectra HX-200 hydraulic press", "Kestrel K5 industrial dehumidifier",
            "Orion L-40 CNC lathe", "Pelican FS-9 floor scrubber", "Tundra BC-12 blast chiller",
            "Atlas AC-3 forklift charger", "Corvid PX-7 plasma cutter",
            "Halcyon WT-2 water treatment skid", "Marlin DP-6 diaphragm pump",
            "Sierra GX-8 laser engraver", "Nimbus AH-4 air handling unit",
            "Falco RB-3 robotic welder"]
PAPERS = [("GridFormer", "sparse attention for tabular forecasting", "ElectraLoad"),
          ("LeafNet", "few-shot plant disease detection", "CropLeaf-12"),
          ("TideCast", "probabilistic sea level nowcasting", "NordTide"),
          ("RouteMind", "learning delivery routes from GPS traces", "UrbanDrops"),
          ("SpecTrace", "anomaly detection in spectrometer logs", "LabSpec-3"),
          ("QuillQA", "question answering over handwritten archives", "ArchiveHands"),
          ("PolyGlotSum", "multilingual summarisation of news", "NewsBridge-9"),
          ("SoilSense", "soil moisture estimation from radar", "FieldRadar"),
          ("ChartReader", "extracting values from bar charts", "PlotBank"),
          ("VoxClean", "speech enhancement for call centres", "CallNoise-5"),
          ("MedTriage", "triage prediction from emergency notes", "ERNotes"),
          ("FleetGraph", "graph models for fleet maintenance", "TruckLogs")]
PROJECTS = ["Helios ERP migration", "Northstar data lake", "Falcon mobile app relaunch",
            "Orchid warehouse automation", "Cobalt cloud cost review", "Juniper customer portal",
            "Quasar payroll consolidation", "Tamarind store refit", "Beacon CRM rollout",
            "Saffron supplier onboarding", "Kepler network upgrade", "Mosaic intranet redesign"]
FILINGS = ["annual return", "statement of capital", "notice of change of directors",
           "confirmation statement", "charge registration", "auditor resignation letter"]

SEGMENTS = ["Consumer", "Industrial", "Services", "Digital", "Wholesale", "Infrastructure",
            "Healthcare", "Marine", "Packaging", "Energy Solutions"]
REGIONS = ["Nordics", "DACH", "Iberia", "North America", "Asia-Pacific", "Benelux", "UK",
           "Central Europe", "Latin America", "Middle East"]
METRICS = ["revenue", "operating profit", "capital expenditure", "net income", "free cash flow",
           "the dividend", "headcount", "energy use", "emissions", "water withdrawal",
           "customer churn", "inventory", "net debt", "order intake", "gross margin",
           "research spending", "investment in new equipment", "depreciation", "payroll costs"]
DIRECTIONS = ["rose", "fell", "was broadly flat", "increased", "declined", "recovered",
              "improved", "weakened"]
REASONS = ["higher volumes", "lower energy prices", "currency effects", "the new plant",
           "price increases", "a weaker product mix", "restructuring costs", "strong demand",
           "supply chain delays", "the acquisition", "one-off items", "wage inflation"]
PARTS = ["intake filter", "drive belt", "seal kit", "coolant pump", "hydraulic hose",
         "bearing", "fuse", "air filter", "gasket", "control board", "sensor", "nozzle",
         "pressure valve", "motor brush", "fan", "oil filter"]
LABELS = ["Land and buildings", "Plant and machinery", "Vehicles", "IT equipment",
          "Fixtures and fittings", "Assets under construction", "Right-of-use assets",
          "Goodwill", "Software", "Customer relationships", "Trade receivables",
          "Other receivables", "Prepayments", "Raw materials", "Work in progress",
          "Finished goods", "Trade payables", "Accruals", "Provisions", "Deferred tax",
          "Depreciation charge", "Impairment", "Disposals",
          "Additions", "Transfers", "Exchange differences", "Lease liabilities",
          "Bank loans", "Pension obligations", "Dividends paid", "Interest paid",
          "Tax paid", "Share-based payments", "Research and development costs"]

SLOTS: dict[str, list[str]] = {
    "city": CITIES, "month": MONTHS, "segment": SEGMENTS, "region": REGIONS,
    "metric": METRICS, "direction": DIRECTIONS, "reason": REASONS, "part": PARTS,
    "label": LABELS, "year": ["2019", "2020", "2021", "2022", "2023"],
}


def person(rng: random.Random) -> str:
    """A random full name (names recur across documents)."""
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def fill(rng: random.Random, pool: list[str], n: int, **fixed: str) -> list[str]:
    """`n` sentences from `pool` (with repeats when `n` exceeds the pool), slots filled.

    `{person}`, `{pct}`, `{num}` and every key of `SLOTS` get fresh random values in each
    sentence; `fixed` slots (such as `{entity}`) keep their given value.
    """
    out = []
    for k in range(n):
        if k % len(pool) == 0:
            order = rng.sample(pool, len(pool))
        template = order[k % len(pool)]
        values = {key: rng.choice(vals) for key, vals in SLOTS.items()}
        values.update(person=person(rng), pct=str(rng.randint(2, 30)),
                      num=str(rng.randint(12, 900)), **fixed)
        out.append(template.format(**values))
    return out


REPORT = [
    "During the year the group kept its focus on disciplined growth and cash generation.",
    "In the {segment} segment {metric} {direction} because of {reason}.",
    "Group {metric} {direction} by {pct}% compared with {year}, mainly due to {reason}.",
    "{metric} in {region} {direction}, reflecting {reason}.",
    "Capital expenditure on new equipment in {city} amounted to EUR {num} million.",
    "We invested EUR {num} million in machinery and buildings at the {city} site.",
    "Spending on property, plant and equipment {direction} to EUR {num} million.",
    "The board proposes a dividend in line with the policy of paying out about half of profit.",
    "The dividend per share {direction} as the board balanced payouts and investment.",
    "Our largest customers in {region} renewed their contracts for {pct} months.",
    "No single customer accounted for more than {pct}% of {segment} revenue.",
    "Water withdrawal at the {city} plant {direction} after process changes.",
    "Scope 1 and 2 emissions {direction} by {pct}% as we switched to renewable power.",
    "The audit committee met {num} times and reviewed the internal control framework.",
    "{person} chairs the {segment} steering group and reports to the executive team.",
    "{person} joined the board in {month} {year} as an independent director.",
    "The new plant in {city} produced its first batch in {month}, on budget.",
    "Headcount grew by {num} people, mostly in sales and engineering.",
    "Net debt {direction} to EUR {num} million, or {pct} tenths of EBITDA.",
    "In {month} we refinanced a bond of EUR {num} million at a lower coupon.",
    "Order intake in the {segment} business {direction} on {reason}.",
    "Research and development spending reached EUR {num} million.",
    "We closed a small warehouse in {city} and moved its volumes to larger sites.",
    "Inflation in wages and materials was largely offset by pricing and productivity.",
    "The outlook for the coming year assumes stable demand and moderate inflation.",
    "Energy costs in {region} {direction} in the second half of the year.",
    "Customer satisfaction in {region} improved to {pct} points above target.",
    "Working capital was managed tightly and inventory days came down by {pct}.",
    "Free cash flow of EUR {num} million funded both the dividend and investment.",
    "The remuneration committee reviewed executive pay against {num} peer companies.",
    "Safety is our first priority and the injury rate {direction} again.",
    "We divested a non-core unit in {region} in {month} for EUR {num} million.",
    "Staff turnover in {city} fell to {pct}% thanks to better onboarding.",
    "The external auditor's fee for the year was EUR {num} thousand.",
    "Impairment testing of goodwill in the {segment} unit found no impairment.",
    "Lease liabilities relate mainly to offices and warehouses in {region}.",
    "Provisions cover warranty claims, restructuring and legal disputes in {city}.",
    "Deferred tax assets are recognised where future taxable profits are probable.",
    "Pension obligations are measured using a discount rate of {pct} tenths of a percent.",
    "Trade receivables are shown net of an allowance for expected credit losses.",
    "Amounts are in EUR million unless otherwise stated; totals may not add up due to rounding.",
    "Depreciation is charged on a straight-line basis over the useful life of each asset.",
    "Shareholders approved all resolutions at the annual general meeting in {month}.",
    "{metric} per employee {direction} to EUR {num} thousand.",
]
MANUAL = [
    "Read this manual completely before installing or operating the machine.",
    "Disconnect the power supply and lock it out before opening any cover.",
    "Replace the {part} only with original spare parts from the manufacturer.",
    "Check the {part} for wear regularly and replace it if damaged.",
    "Do not operate the machine when the room temperature exceeds the limit in the data sheet.",
    "Wear safety glasses, gloves and hearing protection when working near the {part}.",
    "The warranty does not cover damage caused by using non-original parts.",
    "Warranty claims must be made through the dealer in {city} within {num} days.",
    "Error messages are shown on the display with a code and a short text.",
    "If a fault code returns after a restart, contact the service department.",
    "Tighten the screws of the {part} cover to the torque given in the table.",
    "Record every maintenance task in the service log with the date and hours.",
    "The machine weighs several hundred kilograms; use the marked lifting points.",
    "Store the machine in a dry room between 5 and {pct} degrees Celsius.",
    "The {part} is located behind the left side panel.",
    "Lubricate moving parts weekly with the grease specified in the appendix.",
    "A qualified electrician must connect the machine to the mains supply.",
    "The emergency stop button must be reachable from the operator position.",
    "After a power failure the machine restarts only when the reset key is pressed.",
    "Noise emission values were measured at a distance of one metre.",
    "Dispose of used oil, filters and the old {part} according to local rules.",
    "Allow the machine to cool down for {num} minutes before touching hot surfaces.",
    "Level the machine with the adjustable feet before first use.",
    "The control panel shows operating hours, warnings and the last {num} events.",
    "Clean the {part} with a soft brush; never use compressed air.",
    "Spare parts can be ordered from the service centre in {city}.",
    "The service interval counter can be reset after each completed service.",
    "Keep unauthorised persons away from the working area.",
    "Software updates are installed by the service technician during the yearly service.",
    "The maximum permitted supply voltage deviation is {pct} percent.",
    "Replace worn hoses immediately; never repair them with tape.",
    "Check the {part} seal after transport and before the first start.",
]
PAPER = [
    "Prior work on {topic} has mostly used small benchmarks.",
    "We report the mean of five runs with different random seeds.",
    "All hyperparameters were tuned on the validation split only.",
    "Accuracy on the test split improves by {pct} points over the strongest baseline.",
    "We compare against {num} baselines drawn from recent literature on {topic}.",
    "Most labelled examples are used for training, the rest for testing.",
    "A learning rate of {pct}e-4 with a linear warm-up stabilised training.",
    "Training took {num} GPU hours on a single accelerator.",
    "Errors concentrate on rare categories with few training examples.",
    "Ablations show that removing the attention module costs {pct} points of accuracy.",
    "Statistical significance was assessed with a paired bootstrap test.",
    "The model has about {num} million parameters.",
    "Inference runs in real time on commodity hardware.",
    "Performance saturates beyond a moderate model size.",
    "Annotations were produced by three experts with an agreement of 0.{pct}.",
    "Data augmentation improved robustness to noisy inputs.",
    "We release code and configuration files to support reproducibility.",
    "The dataset was split by time to avoid leakage between training and test.",
    "Batch size was set to {num} for all experiments.",
    "Results on the {num} held-out sites are reported in the appendix.",
    "The method is sensitive to the choice of normalisation layer.",
    "Early stopping on validation loss avoided overfitting.",
    "Limitations include the reliance on clean labels and a single domain.",
    "The funding agency had no role in study design or analysis.",
    "Figure captions give the number of runs behind each bar.",
    "Qualitative examples illustrate typical successes and failures on {topic}.",
]
SLIDES = [
    "Steering committee review of scope, schedule and budget",
    "Weekly stand-ups continue with all workstream leads",
    "Change requests are logged and assessed every Friday",
    "Communication plan shared with regional managers in {region}",
    "Training materials drafted for {num} key users",
    "Data quality checks run nightly on migrated records",
    "Budget spent to date is tracked against the approved budget",
    "Go-live readiness checklist reviewed with {person}",
    "Risk register updated: {num} open risks, {pct} closed",
    "Vendor performance reviewed monthly",
    "User acceptance testing planned for {month}",
    "Pilot site in {city} selected",
    "Dependencies with the finance calendar tracked",
    "Decision log updated after each steering meeting",
    "Cut-over rehearsal scheduled for {month}",
    "Licence costs renegotiated with the supplier",
    "Hypercare support for {num} days after go-live",
    "Benefits tracking owned by the business sponsor",
    "Forecast at completion reviewed by finance",
    "Lessons learned session with {person}",
]
FILING = [
    "This form must be delivered to the registrar within {num} days of the change.",
    "The company confirms that the information on the register is up to date.",
    "Particulars of the directors and secretary are given on the following page.",
    "The registered office is situated in {city}.",
    "The statement of capital shows the shares in issue at the date of this return.",
    "Each ordinary share carries one vote at general meetings.",
    "The filing fee of EUR {num} has been paid.",
    "Signed on behalf of the board by a director on {month} {pct}.",
    "The register of members is kept at the registered office.",
    "No charges were created or satisfied during the period.",
    "The persons with significant control are listed in section {pct}.",
    "The accounting reference date is 31 December.",
    "This document is a certified copy of the original filed in {month}.",
    "Information on this form will appear on the public register.",
]
