"""Checks for the lessons' exercises: one module per theme, `check_*` functions, shared helpers in _common."""
