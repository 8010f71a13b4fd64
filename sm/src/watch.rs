//! Placeholder: the watch machine is being written.
