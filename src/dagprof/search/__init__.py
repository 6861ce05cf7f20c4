"""Searching optimisations by replaying transformed graphs: what-if tables and the strategy search."""
from .optimize import Options, SearchResult, search, search_run

__all__ = ["Options", "SearchResult", "search", "search_run"]
