import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "agent"))  # the labelled fake sandbox
sys.path.insert(0, str(Path(__file__).parents[1] / "rollout"))  # the labelled vLLM HTTP stub
