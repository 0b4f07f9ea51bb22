"""Scoring functions (math equivalence, QA F1, sandboxed code tests). Arrive with issues #5 and #7."""
