"""Real tables as they come (issue 35): categories, missing values and string labels.

    python -m benchmarks.tables credit     # credit_data: the product against centralized
                                           # LightGBM and logistic regression, 5 seeds
    python -m benchmarks.tables big        # a 1,000,000 x 100 Parquet table prepared:
                                           # time and peak RSS

Both write their part of ``benchmarks/results/tables.json``; ``python -m
benchmarks.tables.report`` renders the credit table into docs/RESULTS.md and
``python -m benchmarks.report`` the preparation's into docs/PERFORMANCE.md.
"""
