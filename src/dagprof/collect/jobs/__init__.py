"""Starting real jobs: the launch protocol, the network-namespace cluster, verification rounds, the embedded workloads and demo jobs."""
