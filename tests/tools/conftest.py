import sys
from pathlib import Path

# the tools' tests use the server tests' harness and the engine tests' toy model
sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
