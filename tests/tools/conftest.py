import sys
from pathlib import Path

# the tools' tests use the server tests' harness, the engine tests' toy model and the
# scheduler tests' factories
sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
sys.path.insert(0, str(Path(__file__).parents[1] / "scheduler"))
