"""What-if transforms, each a plain ``Graph -> Graph`` function; compose them freely."""
from .buckets import partition_tensors, set_buckets
from .comm import expand_collectives, retime_collectives, set_link, set_scheme, set_topology
from .compute import scale_compute, share_cores
from .link_fit import find_collectives, fit_topology
from .workers import scale_workers

__all__ = [
    "expand_collectives", "find_collectives", "fit_topology", "partition_tensors", "retime_collectives",
    "scale_compute", "scale_workers", "set_buckets", "set_link", "set_scheme", "set_topology", "share_cores",
]
