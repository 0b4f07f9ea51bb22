"""Scoring functions: math answer equivalence (math.py); QA F1 and sandboxed code tests come with issue #7."""
