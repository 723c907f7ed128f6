"""Loss denominators from the plan: the trained-token count of an optimizer step.

A per-token mean over an optimizer step divides by the step's trained tokens over every rank
and micro-batch. Readers that know the step's records from their own plan put that count on
each record they yield under :data:`STEP_LOSS_TOKENS`; the collate turns it into the batch key
of the same name.
"""

from __future__ import annotations

STEP_LOSS_TOKENS = "step_loss_tokens"
"""Record and batch key: the step's trained-token count, identical on every rank."""
