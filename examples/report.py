"""Summarise sales.csv by region and write summary.csv.

Run it in the sandbox with the CSV as an input file:

    pysbx run --file sales.csv=examples/sales.csv --artifacts-dir out examples/report.py
"""
import csv
from collections import defaultdict
from decimal import Decimal

totals = defaultdict(lambda: [0, Decimal("0")])
with open("sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        t = totals[row["region"]]
        t[0] += int(row["units"])
        t[1] += int(row["units"]) * Decimal(row["unit_price"])

with open("summary.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["region", "units", "revenue"])
    for region in sorted(totals):
        units, revenue = totals[region]
        w.writerow([region, units, f"{revenue:.2f}"])

best = max(totals, key=lambda r: totals[r][1])
print(f"{len(totals)} regions, {sum(t[0] for t in totals.values())} units sold")
print(f"best region: {best} ({totals[best][1]:.2f})")
