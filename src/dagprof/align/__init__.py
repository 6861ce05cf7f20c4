"""Joining ranks: collective matching and clock alignment."""
