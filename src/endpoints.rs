//! [`Endpoints`]: the one way every connecting constructor names its
//! servers.

/// The servers a constructor connects to: `X::connect(endpoints)` and
/// `X::with_options(endpoints, options)` take one on every backend
/// ([`Etcd`](crate::Etcd), the etcd, Redis and NATS coordinators).
///
/// Every string is a comma-separated list: `"a:2379,b:2379"`, a `String`,
/// a slice, array or `Vec` of strings (each entry may itself hold several
/// comma-separated servers). Blanks around commas and empty entries are
/// dropped; what is left is checked by the backend, which names the bad
/// entry in an [`Error::InvalidArgument`](crate::Error::InvalidArgument).
///
/// ```
/// use fleetcoord::Endpoints;
///
/// let one = "127.0.0.1:2379, 127.0.0.2:2379".endpoint_list();
/// let two = ["127.0.0.1:2379", "127.0.0.2:2379"].endpoint_list();
/// let three = vec!["127.0.0.1:2379".to_string(), "127.0.0.2:2379".into()].endpoint_list();
/// assert_eq!(one, two);
/// assert_eq!(two, three);
/// ```
pub trait Endpoints {
    /// The servers, one per entry, trimmed, without empty entries.
    fn endpoint_list(&self) -> Vec<String>;
}

/// The entries of one comma-separated list, appended to `out`.
fn split_into(list: &str, out: &mut Vec<String>) {
    out.extend(
        list.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned),
    );
}

fn collect<S: AsRef<str>>(entries: &[S]) -> Vec<String> {
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        split_into(entry.as_ref(), &mut out);
    }
    out
}

impl Endpoints for str {
    fn endpoint_list(&self) -> Vec<String> {
        collect(&[self])
    }
}

impl Endpoints for String {
    fn endpoint_list(&self) -> Vec<String> {
        collect(&[self])
    }
}

impl<S: AsRef<str>> Endpoints for [S] {
    fn endpoint_list(&self) -> Vec<String> {
        collect(self)
    }
}

impl<S: AsRef<str>, const N: usize> Endpoints for [S; N] {
    fn endpoint_list(&self) -> Vec<String> {
        collect(self)
    }
}

impl<S: AsRef<str>> Endpoints for Vec<S> {
    fn endpoint_list(&self) -> Vec<String> {
        collect(self)
    }
}

impl<T: Endpoints + ?Sized> Endpoints for &T {
    fn endpoint_list(&self) -> Vec<String> {
        (**self).endpoint_list()
    }
}

#[cfg(test)]
mod tests {
    use super::Endpoints;

    #[test]
    fn every_shape_gives_the_same_list() {
        let want = vec!["a:1".to_string(), "b:2".to_string()];
        let owned = String::from("a:1,b:2");
        let strs = ["a:1", "b:2"];
        let strings = vec![" a:1 ".to_string(), "b:2,".to_string()];
        assert_eq!("a:1, b:2".endpoint_list(), want);
        assert_eq!(owned.endpoint_list(), want);
        assert_eq!(strs.endpoint_list(), want);
        assert_eq!(strs[..].endpoint_list(), want);
        assert_eq!(strings.endpoint_list(), want);
        assert_eq!(["a:1,b:2"].endpoint_list(), want);
        assert!(" , ".endpoint_list().is_empty());
        assert!(Vec::<String>::new().endpoint_list().is_empty());
    }
}
