"""Distillation trainers: a frozen teacher (the stage's init weights) and a student, no reward."""
