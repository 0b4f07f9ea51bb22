"""Scoring functions only: math answer equivalence (math.py), QA exact match and F1 (qa.py), code tests run in the
sandbox (code.py), video QA's citation and scene-graph F1 (video.py), the weighted reward calculator (calculator.py)."""
