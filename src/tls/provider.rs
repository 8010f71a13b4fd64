//! The rustls CryptoProvider of the bus backends' TLS (NATS, Redis): ring,
//! the provider etcd-client's TLS (tonic with ring) already puts in every
//! build, so no second crypto library (aws-lc-rs) comes in.

/// ring's rustls provider with its default cipher suites and key-exchange
/// groups.
///
/// rustls 0.23.48 deprecates `rustls::crypto::ring::default_provider`
/// because ring offers no post-quantum key exchange, and names no
/// replacement: it is the only public way to build ring's provider, and
/// the only other first-party provider is aws-lc-rs. The allow keeps the
/// build free of warnings on 0.23.48 and later; on earlier 0.23 releases it
/// allows nothing. This is the one place that calls it.
#[allow(deprecated)]
pub(crate) fn ring() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}
