"""Distillation trainers: few-step students of a frozen teacher."""
