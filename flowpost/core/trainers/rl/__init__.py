"""Online trainers: generate with the policy, score with rewards, optimize."""
