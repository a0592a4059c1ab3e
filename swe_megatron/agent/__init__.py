"""The agent: the paper's command interface (ACI), the one-command parser, token provenance, the episode loop."""
