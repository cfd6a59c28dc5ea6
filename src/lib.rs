//! The library half of the `aisql` command line: its arguments and commands,
//! shared by the binary (`main.rs`), `aisql serve`, the shell and the Python
//! package (`python/`), which open sessions the way `aisql sql` does: each
//! fills in an [`EngineConfig`] ([`config`], no command line in it) and
//! [`connect`] opens a session from it.

pub mod cli;
pub mod commands;
pub mod config;

pub use commands::connect::Connection;
pub use config::EngineConfig;

/// Opens a session from `config`: its tables registered, its backend built,
/// statements writing only when `config.allow_writes` (a refused one says
/// [`commands::connect::HOW_TO_ALLOW_WRITES`]).
pub async fn connect(config: &EngineConfig) -> anyhow::Result<Connection> {
    Connection::open(config).await
}
