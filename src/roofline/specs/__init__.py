"""Inputs as validated frozen records: chips, models, systems. Data files, no formulas."""
