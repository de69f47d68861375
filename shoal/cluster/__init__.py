"""Starting and running a cluster: a local one for a command or a test (`LocalCluster`),
one host's part of a bare-metal cluster from its cluster file (`cluster_up`), the node
processes, etcd, and which GPU each worker gets."""
