"""Rollouts: tasks x G episodes run concurrently across engine servers and sandboxes, graded, written as JSONL."""
