//! fleetcoord: cross-host coordination on etcd v3 for blocking programs.
