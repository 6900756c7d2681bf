"""Rollout: vLLM engine actors, the weight-sync worker extension, sampling."""
