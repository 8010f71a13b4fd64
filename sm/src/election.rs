//! Placeholder: the election machine is being written.
