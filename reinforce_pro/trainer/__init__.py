"""The controller side: experience maker, fit() loop, logging, warm start."""
