"""Generation engines behind one small interface: token ids in, sampled ids + logprobs out; weight reload."""
