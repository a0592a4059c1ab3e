"""Model-side pieces shared by the engines and the trainer (tokenizer)."""
