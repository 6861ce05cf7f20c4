"""Where the vendored reference data lives (tests/data, see its README): tests never read outside the repository."""
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
KINETO_PUBLIC = DATA / "kineto-public"
KINETO_CORPUS = DATA / "kineto-corpus"
GLOO_WINDOWS = DATA / "gloo-windows"
