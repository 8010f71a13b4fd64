//! One case of the suite and what it runs with: the declaration it needs
//! (so a backend that cannot deliver is skipped visibly, not failed) and a
//! context that opens handles and closes them when the case ends, pass or
//! fail.

use crate::coordinator::{Capabilities, Coordinator};
use std::cell::RefCell;
use std::sync::Arc;

/// A named check and the declaration it needs.
pub(super) struct Case {
    /// What the report and a failure call it.
    pub(super) name: &'static str,
    /// What the backend must declare for the case to run.
    pub(super) needs: Needs,
    /// The check; it fails by panicking with a message for the author.
    pub(super) run: fn(&Ctx<'_>),
}

/// What a case needs a backend to declare.
#[derive(Clone, Copy)]
pub(super) enum Needs {
    /// Every backend, even one that delivers nothing (noop).
    Nothing,
    /// Feeds deliver what is published, appended and set.
    Delivery,
    /// Delivery, and streams trimmed to a maximum length.
    Trimming,
}

impl Needs {
    /// Why `caps` cannot run such a case; `None` when it can.
    pub(super) fn unmet(self, caps: &Capabilities) -> Option<&'static str> {
        match self {
            Needs::Nothing => None,
            Needs::Delivery if !caps.delivers => Some("it does not deliver"),
            Needs::Trimming if !caps.delivers => Some("it does not deliver"),
            Needs::Trimming if caps.stream_max_len.is_none() => Some("no stream trimming"),
            Needs::Delivery | Needs::Trimming => None,
        }
    }
}

/// What a case runs with.
pub(super) struct Ctx<'a> {
    pub(super) factory: &'a dyn Fn() -> Box<dyn Coordinator>,
    /// Opens a handle with a given feed capacity, for the slow-consumer
    /// cases (`factory` then opens handles of their capacity).
    pub(super) with_capacity: Option<&'a dyn Fn(usize) -> crate::Result<Box<dyn Coordinator>>>,
    /// Restarts the backend's server, when the suite was given a way to.
    pub(super) restart: Option<&'a dyn Fn() -> crate::Result<()>>,
    /// What the backend declared.
    pub(super) caps: Capabilities,
    /// Every handle the case opened, for the runner to close.
    pub(super) opened: RefCell<Vec<Arc<dyn Coordinator>>>,
    /// Why the backend could not run the case, when it said so.
    pub(super) unsupported: RefCell<Option<String>>,
}

impl Ctx<'_> {
    /// A new handle, closed when the case ends.
    pub(super) fn open(&self) -> Arc<dyn Coordinator> {
        let c: Arc<dyn Coordinator> = Arc::from((self.factory)());
        self.opened.borrow_mut().push(c.clone());
        c
    }
}

impl Ctx<'_> {
    /// Records that the backend (or its server's version) does not offer
    /// what the case checks, and why: reported, never a silent skip.
    pub(super) fn unsupported(&self, why: String) {
        self.unsupported.borrow_mut().get_or_insert(why);
    }

    /// Prints a figure the case measured, for the suite's output.
    pub(super) fn note(&self, text: String) {
        use std::io::Write;
        let _ = writeln!(std::io::stderr().lock(), "  note: {text}");
    }
}

/// A name no other case or run uses.
pub(super) fn unique(base: &str) -> String {
    format!("{base}-{}", uuid::Uuid::new_v4().simple())
}
