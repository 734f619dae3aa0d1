"""The grader's machinery: case table, timing, tiers and points, reports (used by get_score.py and tests)."""
