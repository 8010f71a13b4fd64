//! What the backend's unit tests share.

use redis::RedisError;

/// An error reply of `kind` from the server.
pub(super) fn server(kind: redis::ServerErrorKind) -> RedisError {
    RedisError::from((redis::ErrorKind::Server(kind), "from the server"))
}
