"""Dataset formats: costed writers and plan-following readers for MDS and WebDataset."""
