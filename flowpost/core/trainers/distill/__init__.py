"""Distillation trainers: few-step students of a frozen teacher (the stage's init weights), no reward."""
