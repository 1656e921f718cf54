"""Reading what a trained model does, built on the hook points of nn/hooks.py: head detectors
(previous-token, duplicate-token, induction, first-token) and head ablation."""
