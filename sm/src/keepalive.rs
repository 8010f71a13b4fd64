//! Placeholder: the keepalive machine is being written.
