"""A year of daily visits, with a 28-day rolling mean, as a chart.

Run it in the sandbox with the vetted packages:

    pysbx run --packages pandas,matplotlib examples/chart.py --artifacts-dir out

The figure left open comes back as out/figure-1.png; the table is printed;
the value of the last line (the year's total) comes back in --json's "value".
"""
import numpy as np
import pandas as pd
import matplotlib.pyplot as plt

rng = np.random.default_rng(7)
days = pd.date_range("2026-01-01", periods=365, freq="D")
weekly = np.where(days.dayofweek < 5, 1.0, 0.6)
season = 1 + 0.3 * np.sin(2 * np.pi * (days.dayofyear - 80) / 365)
visits = pd.Series(rng.poisson(400 * weekly * season), index=days, name="visits")

monthly = visits.resample("MS").sum()
print(monthly.rename(lambda d: d.strftime("%b")).to_string())

fig, ax = plt.subplots(figsize=(8, 4))
ax.plot(visits.index, visits, lw=0.6, alpha=0.5, label="daily")
ax.plot(visits.index, visits.rolling(28, center=True).mean(), lw=2, label="28-day mean")
ax.set_title("Visits per day, 2026")
ax.set_ylabel("visits")
ax.legend()
fig.autofmt_xdate()

int(visits.sum())
