"""Presentation only: text tables, versioned JSON, plots. No formulas here."""
