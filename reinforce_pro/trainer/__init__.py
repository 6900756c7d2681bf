"""The controller side: experience builder, fit() loop, rollout streams, logging, warm start."""
