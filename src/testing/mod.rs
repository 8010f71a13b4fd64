//! Placeholder: the etcd test harness is being written.
