"""A class-grading test submission that fails on import."""
raise ImportError("class_broken: this submission does not import")
