import sys
from pathlib import Path

# The agent tests' labelled fake sandbox and the grading tests' tiny real task are shared here.
sys.path.insert(0, str(Path(__file__).parents[1] / "agent"))
sys.path.insert(0, str(Path(__file__).parents[1] / "grading"))
