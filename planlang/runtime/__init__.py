"""Runtime: executing resolved plans on torch.distributed (local op lowering, collectives)."""
