//! Placeholder: the observe machine is being written.
