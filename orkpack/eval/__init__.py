"""``orkpack eval``: what a pack does to the model's answers (docs/EVAL.md)."""
