"""Worked answers to the lessons' exercises: one file per lesson, each with an ANSWERS mapping (lessons/README.md)."""
