import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # tests/synthetic.py

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
