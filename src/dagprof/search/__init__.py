"""Searching optimisations by replaying transformed graphs."""
from .buckets import BucketChoice, BucketSearch, search_bucket_sizes

__all__ = ["BucketChoice", "BucketSearch", "search_bucket_sizes"]
